"""The timings that shape how a move behaves, in one place, each with why it is what it is.

Several of these are tied to each other across components (a kubelet's wait must end
before the API server's limit; a prefetched restore must outlive the rollback timeout; an
event hold must outlive everything a move can take), so they live side by side, and
``tests/unit/test_timing.py`` checks the ties.  Flags that users set (``kube32-sim
control-plane --move-rollback-timeout`` and the other control plane timings of
``kube32.sim.main``) keep their defaults here too.  All values are seconds.

Imports nothing.
"""
from __future__ import annotations

from typing import Final

# --- a move's critical path ----------------------------------------------------------
# A kubelet lets a numbered held request into its pod after the one numbered before it,
# waiting at most this long for that one (kube32.kubelet.ordering): the held requests
# of a window are sent within milliseconds of each other, so only a request lost on its
# way (its client gone, its connection failed) is waited for this long, and that is rare.
HOLD_ORDER_WAIT: Final = 1.0

# The Checkpoint controller writes a move's Moving status and event this long after the
# replacement, not at once: a small pod's restore (tens of ms) then runs without the
# control plane serving these writes and their watch events in its middle.  The
# replacement does not depend on them; its own status is what a user, a Service and the
# Deployment wait for.
MOVING_WRITE_DELAY: Final = 0.05

# The kubelet reports a frozen pod Ready=False this late (the spec allows 2 s): a move's
# source pod is usually replaced by then, so the write is not made at all instead of
# competing with the move's own requests (a request routed to the frozen pod meanwhile
# gets 503 with Retry-After).
FROZEN_REPORT_DELAY: Final = 0.15

# An eviction that moves a pod answers once the pod is replaced, waiting this long at
# most: `kubectl drain` looks at the pod right after the answer and then once a second,
# so an answer given at once would make it find the old pod and sit a second on it.  The
# same bound caps an eviction's wait for a move under way to end.
REPLACED_WAIT: Final = 5.0

# An eviction whose move rolled back (the pod went back to the node it was to leave) is
# refused (429) with the reason, and so is every eviction of that pod for this long after
# the rollback: `kubectl drain` asks again every 5 s, and each new move would freeze the
# pod, hand it to the target that just failed it and roll back again (up to the rollback
# timeout each time).  Long enough for a drain's --timeout to end with the reason; then an
# eviction moves it again.
EVICTION_BACKOFF_AFTER_ROLLBACK: Final = 60.0

# An eviction refused (429) because its pod was a move's replacement still restoring is
# remembered this long for the client's retry (`kubectl drain` asks again every 5 s,
# naming the pod only): should the move roll back meanwhile, the retry is about the pod
# that has left the drained node, not the one now back on its source.
EVICTION_RETRY_MEMORY: Final = 60.0

# --- rollback, and what must outlast it -------------------------------------------
# A moved pod's replacement that does not run by then goes back to its source
# (--move-rollback-timeout).
MOVE_ROLLBACK_SECONDS: Final = 60.0

# A move's target began restoring before its replacement existed (kube32.kubelet.prefetch);
# unclaimed for this long it drops the prepared instance.  Longer than the rollback
# timeout: the replacement may come as late as that.
PREFETCH_UNCLAIMED_SECONDS: Final = MOVE_ROLLBACK_SECONDS + 10.0

# A Checkpoint data GET may wait (?waitSeconds=) for its data to begin arriving at most
# this long; a kubelet prefetching a move's data asks for a little less, so the API
# server answers before the kubelet's own request gives up.
DATA_WAIT_MAX_SECONDS: Final = 60
PREFETCH_DATA_WAIT_SECONDS: Final = 50

# A snapshot upload or pull that sends no byte for this long is cut (408), and the move
# fails: a node that stalls never holds the control plane's checkpoint space.
SNAPSHOT_STALL_SECONDS: Final = 10.0

# --- the control plane's one snapshot slot -------------------------------------------
# The spec's freeze timeout: how long a pod's current call may take to return before a
# snapshot of it fails ("call k32_handle still running after 10000 ms"), and the most a
# caller may give (a node's ``timeoutMs``).
FREEZE_TIMEOUT_SECONDS: Final = 10.0
FREEZE_TIMEOUT_MAX_SECONDS: Final = 60.0

# The Checkpoint controller asks a node to freeze a pod for this long at a time, while it
# holds the control plane's one snapshot slot: a pod still in a call then gives the slot
# to the next snapshot (other namespaces first) and tries again at its next turn, until
# the freeze timeout has passed since its first try.  A pod that never leaves its call so
# holds every other snapshot up this long, not the whole freeze timeout.
FREEZE_TRY_SECONDS: Final = 1.0

# A node asked for a snapshot must begin its answer within the freeze timeout it was given
# and this long more (its wait for the topic line the snapshot must follow,
# EVENTS_SEQ_WAIT, and its first bytes); one that does not gets 504, and the slot goes to
# the next snapshot.
SNAPSHOT_ANSWER_SECONDS: Final = 5.0

# A node asked for a move's snapshot waits this long at most for the topic line the
# snapshot must follow (every event published before the control plane held the pod's),
# then takes it without: shorter than SNAPSHOT_ANSWER_SECONDS, so its answer still begins
# in time.
EVENTS_SEQ_WAIT: Final = 2.0

# The Checkpoint controller looks again at a Checkpoint waiting for its pod's move this
# often: a move's steps (a replacement Running, a rollback) are writes to other objects.
MOVE_POLL_SECONDS: Final = 0.5

# --- room in the checkpoint data space (kube32.apiserver.dataspace.Room) -------------
# Snapshot data waiting for room that moves in flight hold looks again this often: a move
# ends by writes (its Checkpoint's phase, its pod's restore-from) the data space does not
# see.
ROOM_LOOK_SECONDS: Final = 0.5

# Room promised to a snapshot before its pod freezes is let go this long after, unless its
# data is arriving by then (the Checkpoint controller promised it and died): longer than a
# snapshot waits for the control plane's one snapshot slot.
ROOM_HOLD_SECONDS: Final = 120.0

# A snapshot whose ask for room ran out of patience keeps its place in line this long, for
# its asker's next ask (the Checkpoint controller asks again at once, after writing where
# its Checkpoint stands): a namespace behind it does not pass it between two asks.
ROOM_LINGER_SECONDS: Final = 2.0

# The Checkpoint controller asks for room for a snapshot this long at a time (the API
# server holds the ask open until room comes or this passes), and between asks its
# Checkpoint's Pending message says where it stands.
ROOM_ASK_SECONDS: Final = 5

# A snapshot waits for room at most the rollback timeout and this long more: what the
# moves in flight that hold the room take to end (a move's replacement rolls back after
# the rollback timeout, and the rollback restores; a snapshot is taken within the freeze
# timeout and sent at the data pace).  Then the Checkpoint fails, its pod never frozen.
ROOM_WAIT_EXTRA_SECONDS: Final = 30.0

# A pod frozen for a move that its node still runs after this long is thawed by the
# node: no pod stays frozen for ever when the control plane never comes back.
FROZEN_MAX_SECONDS: Final = 300.0
# ... and the node looks for such pods this often (a thaw comes at most this late).
THAW_SWEEP_SECONDS: Final = 5.0

# A moving pod's events are held at most this long, then go to the pod of that name if
# it runs: longer than anything a move can take (the snapshot, 120 s; the rollback,
# MOVE_ROLLBACK_SECONDS; a node's thaw, FROZEN_MAX_SECONDS).
EVENT_HOLD_SECONDS: Final = 600.0

# A restoring pod its node refused (admission: no room) goes to the scheduler again with
# its restore-from; a pod refused again soon after waits this long before the next try,
# doubling up to the maximum, so a node and the scheduler that disagree for a while (a pod
# still stopping there) never make a loop of replacements.
REFUSED_RESTORE_BACKOFF: Final = 1.0
REFUSED_RESTORE_BACKOFF_MAX: Final = 60.0

# --- around a move ------------------------------------------------------------------
# A kubelet answers requests for a pod that moved away with 503 and Retry-After this
# long, so a client retries through the API server and reaches the pod on its new node.
MOVED_AWAY_SECONDS: Final = 10.0

# A move the node refused waits this long at most for the node to name its blockers.
NODE_BLOCKERS_TIMEOUT: Final = 5.0

# --- a node's image pulls and its stop -----------------------------------------------
# A kubelet's pull of a wasm:// image gives up after this long; the Checkpoint
# controller's pre-pull on a move's target (kube32.controllers.imagecheck's
# PULL_TIMEOUT_SECONDS) waits no less, so it hears the node's own answer.
IMAGE_PULL_SECONDS: Final = 60.0

# A leaving node drains itself (moves or deletes its pods) for this long at most...
DRAIN_SECONDS: Final = 20.0
# ... and whoever stops a node process (kube32-sim up, the control plane's own node)
# waits this long for it before killing it: the drain, and then its stop.
NODE_STOP_SECONDS: Final = DRAIN_SECONDS + 10.0

# --- a pod's start ---------------------------------------------------------------------
# A module's start function and its k32_init (k32_restored at a restore) must return
# within this, else the container never started: terminated StartError, a Failed event,
# restarted per its policy.  Not the 120 s call timeout (that one outlasts the longest
# freeze, which never waits on a start): a start that loops forever shows in half a
# minute, and a restore that hangs in k32_restored fails before its move rolls back.
START_TIMEOUT_SECONDS: Final = 30.0

# --- the control plane's own bookkeeping ----------------------------------------------
# A watch with allowWatchBookmarks=true gets a BOOKMARK this often (and one just before
# its timeoutSeconds ends), so a client that reconnects resumes from a recent revision
# rather than one compaction may have dropped.  kube-apiserver's are about a minute
# apart; more often costs a line per watch, less often lets a quiet watch's revision age.
WATCH_BOOKMARK_INTERVAL: Final = 10.0

# A nodePort's claim in the store (kube32.apiserver.nodeports) whose Service does not
# hold the port is a leftover (a write that failed after its claim, an API server that
# stopped between the two) only when it is older than this: a create or update in flight
# holds its claim before the Service is written.  kube-apiserver's repair loop frees
# such ports after it saw them leaked three times, minutes apart; here a claim is
# reclaimed when someone asks for its port.
NODE_PORT_CLAIM_GRACE_SECONDS: Final = 60.0

# --- Jobs and CronJobs ----------------------------------------------------------------
# A Job whose pod failed makes the next one after this long, doubling with each failure up
# to the maximum (Kubernetes' DefaultJobPodFailureBackOff and MaxJobPodFailureBackOff;
# ``kube32-sim control-plane --job-backoff`` sets the first step).
JOB_BACKOFF_SECONDS: Final = 10.0
JOB_BACKOFF_MAX_SECONDS: Final = 360.0

# The CronJob controller looks at each CronJob at its next scheduled time; and at least
# this often, so a clock that jumps (a board's, set late) is seen.
CRONJOB_LOOK_SECONDS: Final = 60.0


class ScaledClock:
    """Wall time that runs ``speed`` times as fast from ``origin`` (epoch seconds): the
    CronJob controller's clock under the test fault ``fast-cron`` (kube32.testing), where a
    minute of schedule passes in a second.  ``speed`` 1 is the wall clock itself."""

    def __init__(self, speed: float, origin: float) -> None:
        self.speed, self.origin = speed, origin

    def of(self, real: float) -> float:
        """The clock's time at the wall-clock instant ``real``."""
        return self.origin + (real - self.origin) * self.speed

    def real_delay(self, seconds: float) -> float:
        """How long in wall time ``seconds`` of this clock take."""
        return seconds / self.speed

# --- CustomResourceDefinitions' CEL rules ------------------------------------------------
# One request's x-kubernetes-validations stop after this long, whatever their step budget
# (kube32.apiserver.celrules.REQUEST_BUDGET) left: Kubernetes' runtime budget is "roughly 1
# second" of CEL, and a write should not wait on its rules much longer than that on a busy
# 2-core machine.  They run on a thread of their own, so the event loop is not held meanwhile.
CEL_REQUEST_SECONDS: Final = 2.0
