"""What a Checkpoint's status says of its data (kube32.apiserver.checkpointstatus) and how
kubectl's table shows it."""
from kube32.apiserver import checkpointstatus
from kube32.apiserver.strategies.checkpoint import CheckpointStrategy

FACTS = {"sizeBytes": 65536 + 200, "snapshotSha256": "ab", "imageSha256": "cd", "podTimeMs": 7}


def saved() -> dict:
    return {"metadata": {"name": "s", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"podName": "p", "action": "Save"},
            "status": {"phase": "Saved", "nodeName": "sim-1", "message": "", **FACTS,
                       "conditions": [{"type": "Other", "status": "True"}]}}


def test_data_gone_removes_the_facts_and_says_why_and_storing_again_undoes_it() -> None:
    ck = saved()
    checkpointstatus.mark_gone(ck["status"], checkpointstatus.RESTARTED)
    st = ck["status"]
    assert st["phase"] == "Saved" and not set(FACTS) & set(st)
    gone = checkpointstatus.gone(ck)
    assert gone is not None and gone["reason"] == "ControlPlaneRestarted" and st["conditions"][0]["type"] == "Other"
    checkpointstatus.mark_gone(st, checkpointstatus.DROPPED)  # one DataStored condition, the latest reason
    assert [c["reason"] for c in st["conditions"] if c["type"] == "DataStored"] == ["Dropped"]
    checkpointstatus.stored(st, FACTS)
    assert checkpointstatus.gone(ck) is None and st["sizeBytes"] == FACTS["sizeBytes"]
    assert st["conditions"] == [{"type": "Other", "status": "True"}]


def test_kubectl_shows_size_none_and_the_reason_once_the_data_is_gone() -> None:
    ck = saved()
    row = CheckpointStrategy().row(ck)
    assert row[5] == "64Ki" and row[-1] == ""
    checkpointstatus.mark_gone(ck["status"], checkpointstatus.DROPPED)
    row = CheckpointStrategy().row(ck)
    assert row[3] == "Saved" and row[5] == "<none>" and row[-1] == checkpointstatus.DROPPED[1]
