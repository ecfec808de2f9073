"""Which namespaces the operator watches (`transcription_operator.scope`): names, patterns
and `!` exclusions, and the clear error for an entry that is neither."""

from __future__ import annotations

import pytest

from transcription_operator.main import parse_args
from transcription_operator.scope import Scope


def test_no_entries_watch_every_namespace_cluster_wide() -> None:
    scope = Scope.of([])
    assert scope.cluster_wide and scope.listed == (None,)
    assert scope.admits("anything") and str(scope) == "all namespaces"


def test_names_are_listed_one_by_one_and_admit_only_themselves() -> None:
    scope = Scope.of(["speech", " asr "])
    assert not scope.cluster_wide and scope.listed == ("speech", "asr")
    assert scope.admits("asr") and not scope.admits("asr-2") and not scope.admits("other")


def test_a_pattern_reads_cluster_wide_and_admits_what_matches() -> None:
    scope = Scope.of(["team-*", "!team-ci-*", "asr"])
    assert scope.cluster_wide and scope.listed == (None,)
    assert scope.admits("team-a") and scope.admits("asr")
    assert not scope.admits("team-ci-1")  # left out by the `!` entry
    assert not scope.admits("other")  # matches no positive entry


def test_exclusions_alone_admit_every_other_namespace() -> None:
    scope = Scope.of(["!lane-b-*", "!kube-?ystem"])
    assert scope.cluster_wide
    assert scope.admits("default") and scope.admits("lane-a-1")
    assert not scope.admits("lane-b-1") and not scope.admits("kube-system")


def test_a_namespace_object_is_judged_by_its_name_the_rest_by_their_namespace() -> None:
    scope = Scope.of(["team-*"])
    assert scope.admits_object({"kind": "Namespace", "metadata": {"name": "team-a"}})
    assert not scope.admits_object({"kind": "Namespace", "metadata": {"name": "other"}})
    assert scope.admits_object({"kind": "Pod", "metadata": {"namespace": "team-a", "name": "p"}})
    assert not scope.admits_object({"kind": "Pod", "metadata": {"namespace": "x", "name": "p"}})


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("a,b", "one namespace or pattern per entry"),
        ("Speech", "neither a namespace name"),
        ("team_a", "neither a namespace name"),
        ("!", "neither a namespace name"),
        ("x" * 64, "neither a namespace name"),
    ],
)
def test_an_entry_that_is_neither_a_name_nor_a_pattern_is_refused(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Scope.of([entry])
    assert Scope.of(["speech"]).admits("speech")  # nothing kept from the refusal


def test_the_command_line_refuses_a_bad_entry_naming_where_it_came_from(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["-n", "Team-*"])
    assert e.value.code == 2
    assert "'Team-*': neither a namespace name" in capsys.readouterr().err
    monkeypatch.setenv("WATCH_NAMESPACES", "team-*,!team-ci-*")
    assert parse_args([]).scope == Scope(("team-*", "!team-ci-*"))
    assert parse_args(["-n", "speech"]).scope == Scope(("speech",))  # the flag wins
