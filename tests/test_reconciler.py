"""Pure parts of the reconciler: drift detection."""

from __future__ import annotations

from transcription_operator.reconciler import is_subset


def test_fields_the_api_server_adds_are_not_drift() -> None:
    desired = {"spec": {"ports": [{"name": "http", "port": 8000}], "type": "ClusterIP"}}
    live = {"spec": {"ports": [{"name": "http", "port": 8000, "protocol": "TCP"}], "type": "ClusterIP",
                     "clusterIP": "10.0.0.1"}, "status": {}}  # fmt: skip
    assert is_subset(desired, live)


def test_changed_removed_or_added_items_are_drift() -> None:
    desired = {"spec": {"replicas": 2, "env": [{"name": "A", "value": "1"}]}}
    assert not is_subset(desired, {"spec": {"replicas": 5, "env": [{"name": "A", "value": "1"}]}})
    assert not is_subset(desired, {"spec": {"env": [{"name": "A", "value": "1"}]}})
    assert not is_subset(
        desired, {"spec": {"replicas": 2, "env": [{"name": "A", "value": "1"}, {"name": "B"}]}}
    )


def test_scalars_compare_by_value() -> None:
    assert is_subset({"limits": {"nvidia.com/gpu": "1"}}, {"limits": {"nvidia.com/gpu": "1"}})
    assert is_subset({"port": 8000}, {"port": 8000.0})
    assert not is_subset({"enabled": True}, {"enabled": 1})
    assert not is_subset({"a": {"b": 1}}, {"a": "x"})
