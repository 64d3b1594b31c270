"""MutationCache: a controller's own writes seen before its informer shows them."""
from kube32.client import CHECKPOINTS, Informer, MutationCache


def obj(rv: int, phase: str, uid: str = "u1") -> dict:
    return {"metadata": {"name": "ck", "namespace": "default", "uid": uid, "resourceVersion": str(rv)},
            "status": {"phase": phase}}


def informer_with(*objs: dict) -> Informer:
    inf = Informer(None, CHECKPOINTS)  # type: ignore[arg-type] - never started: no client needed
    for o in objs:
        inf.cache["default/ck"] = o
    return inf


def deliver(inf: Informer, etype: str, o: dict) -> None:
    old = inf.cache.get("default/ck")
    if etype == "DELETED":
        inf.cache.pop("default/ck", None)
    else:
        inf.cache["default/ck"] = o
    inf._emit(etype, o, old)


def test_an_own_write_shows_until_the_informer_catches_up() -> None:
    inf = informer_with(obj(10, "Pending"))
    cache = MutationCache(inf)
    cache.mutated(obj(12, "Saving"))
    assert cache.get("default/ck")["status"]["phase"] == "Saving"
    deliver(inf, "MODIFIED", obj(11, "Pending"))  # an older event: the own write still wins
    assert cache.get("default/ck")["status"]["phase"] == "Saving"
    deliver(inf, "MODIFIED", obj(12, "Saving"))
    assert cache._mine == {}
    deliver(inf, "MODIFIED", obj(15, "Moving"))
    assert cache.get("default/ck")["status"]["phase"] == "Moving"


def test_an_own_write_never_hides_a_newer_copy_or_outlives_the_object() -> None:
    inf = informer_with(obj(20, "Moving"))
    cache = MutationCache(inf)
    cache.mutated(obj(18, "Saving"))  # answered after the informer had already moved on
    assert cache.get("default/ck")["status"]["phase"] == "Moving"
    cache.mutated(obj(25, "Completed"))
    deliver(inf, "DELETED", obj(20, "Moving"))
    assert cache.get("default/ck") is None
    cache.mutated(obj(30, "Pending", uid="u2"))
    deliver(inf, "ADDED", obj(29, "Pending", uid="u3"))  # another object of that name
    assert cache.get("default/ck")["metadata"]["uid"] == "u3"
