"""The test bed's KEDA, built with the scalers it uses only (toolchain/keda.py): which
cases of KEDA's scaler switch and which files of its scalers package stay, the clear errors
when a new KEDA version no longer matches, and a new cache entry when the choice changes.
The build itself runs in `make test`; e2e/test_scaling.py scales pools through it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import toolchain
from toolchain import keda

# The shape of KEDA's scalers_builder.go around its switch (not its text).
BUILDER = """package scaling

func buildScaler(triggerType string) (Scaler, error) {
\t// TRIGGERS-START
\tswitch triggerType {
\tcase "apache-kafka":
\t\treturn NewKafka(config)
\tcase "cpu":
\t\treturn NewCPUMemory(cpu, config)
\t// TODO: a comment between cases
\tcase "external":
\t\treturn NewExternal(config)
\tcase "memory":
\t\treturn NewCPUMemory(memory, config)
\tdefault:
\t\treturn nil, fmt.Errorf("no scaler found for type: %s", triggerType)
\t}
\t// TRIGGERS-END
}
"""


def test_only_the_named_cases_and_the_default_stay() -> None:
    out = keda.keep_cases(BUILDER, ("cpu", "memory"))
    assert '"cpu"' in out and '"memory"' in out and "NewCPUMemory(memory" in out
    assert '"apache-kafka"' not in out and "NewKafka" not in out
    assert '"external"' not in out and "TODO" not in out
    assert "no scaler found for type" in out  # an unknown type's error, as KEDA words it
    start, end = out.index(keda.START), out.index(keda.END)
    assert out[:start] == BUILDER[: BUILDER.index(keda.START)]
    assert out[end:] == BUILDER[BUILDER.index(keda.END) :]
    assert out.count("case ") == 2


def test_a_builder_without_the_markers_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match=re.escape("TRIGGERS-START ... // TRIGGERS-END block")):
        keda.keep_cases(BUILDER.replace("// TRIGGERS-END", ""), ("cpu",))


def test_a_trigger_the_builder_lacks_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="no case for external-push, cron: update TRIGGERS"):
        keda.keep_cases(BUILDER, ("cpu", "external-push", "cron"))


def fake_keda(root: Path, files: tuple[str, ...]) -> Path:
    scalers = root / "pkg" / "scalers"
    scalers.mkdir(parents=True)
    for name in (*files, "kafka_scaler.go", "azure_queue_scaler.go", "kafka_scaler_test.go"):
        (scalers / name).write_text("package scalers\n")
    (scalers / "kafka").mkdir()  # a client's own package: nothing imports it any more
    (scalers / "kafka" / "client.go").write_text("package kafka\n")
    builder = root / keda.BUILDER
    builder.parent.mkdir(parents=True)
    cases = "".join(f'\tcase "{t}":\n\t\treturn New(config)\n' for t in ("kafka", *keda.TRIGGERS))
    builder.write_text(
        BUILDER.replace(BUILDER[BUILDER.index("\tcase") : BUILDER.index("\tdefault")], cases)
    )
    return scalers


def test_trimming_keeps_the_kept_scalers_files_and_declares_what_they_lacked(
    tmp_path: Path,
) -> None:
    scalers = fake_keda(tmp_path, keda.FILES)
    keda.trim(tmp_path)
    assert sorted(p.name for p in scalers.glob("*.go")) == sorted((*keda.FILES, "trimmed.go"))
    assert 'const externalMetricType = "External"' in (scalers / "trimmed.go").read_text()
    assert (scalers / "kafka" / "client.go").exists()  # other packages are left as they are
    builder = (tmp_path / keda.BUILDER).read_text()
    assert '"kafka"' not in builder and all(f'case "{t}"' in builder for t in keda.TRIGGERS)


def test_a_kept_file_the_source_lacks_is_refused_by_name(tmp_path: Path) -> None:
    fake_keda(tmp_path, keda.FILES[:-1])
    with pytest.raises(SystemExit, match=f"no {keda.FILES[-1]}: update FILES"):
        keda.trim(tmp_path)
    assert (tmp_path / "pkg" / "scalers" / "kafka_scaler.go").exists()  # nothing removed


def test_another_choice_of_scalers_names_a_new_cache_entry() -> None:
    (trim,) = toolchain.KEDA.trims
    other = dataclasses.replace(trim, recipe="trim=other")
    assert dataclasses.replace(toolchain.KEDA, trims=(other,)).dir != toolchain.KEDA.dir
    assert dataclasses.replace(toolchain.KEDA, trims=()).dir != toolchain.KEDA.dir
    assert toolchain.KEDA.dir.name.startswith(f"keda-{toolchain.KEDA.version}-")


def test_a_source_the_trimming_no_longer_fits_stops_the_build_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KEDA version whose scalers' files moved: the build stops before `go build`, naming
    what to update, and leaves no half-made folder in the cache."""
    cache, source = tmp_path / "cache", tmp_path / "keda"
    (source / "pkg" / "scalers").mkdir(parents=True)  # none of the kept files
    monkeypatch.setattr(toolchain, "CACHE", cache)
    monkeypatch.setattr(toolchain, "module_dir", lambda tool, module=None: source)
    with pytest.raises(SystemExit, match=re.escape("update FILES in toolchain/keda.py")):
        toolchain._build_one(toolchain.KEDA, ["operator"], "[1/1]")
    assert list(cache.iterdir()) == []
