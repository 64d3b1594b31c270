"""A kopf operator for tests/e2e/test_crds.py: Widgets get status.seen = spec.replicas; a
delete handler (hence kopf's finalizer) records nothing but must run before the Widget goes."""
import kopf


@kopf.on.create("example.com", "v1", "gizmos")
def created(spec, patch, **_):
    patch.status["seen"] = spec.get("replicas")


@kopf.on.delete("example.com", "v1", "gizmos")
def deleted(name, logger, **_):
    logger.info(f"gizmo {name} deleted")
