"""K32S v1 snapshots of request pods: format, streaming writer, streaming reader.

The snapshot holds a pod's linear memory, mutable globals, tables, clock,
channels and held events (spec: "Snapshot format" in pod-migration.md).
`SnapshotWriter` streams it from the pod's memory without copying the memory;
`SnapshotReader` validates it while it arrives and writes the memory straight
into the new instance's memory.  Every refusal is one `SnapshotError` whose
message names the cause and whose `cause` is a short code.

Layering: this package imports nothing else of Kube32.
"""

from .format import (
    CAUSES, HEADER_SIZE, MAGIC, MAX_CHANNEL_HANDLE, MAX_CHANNEL_NAME, MAX_CHANNELS, MAX_EVENT_BYTES,
    MAX_EVENTS, MAX_GLOBALS, MAX_TABLES, NULL_FUNC, PAGE_SIZE, SECTION_CHANNELS, SECTION_EVENTS,
    SECTION_GLOBALS, SECTION_MEMORY, SECTION_NAMES, SECTION_TABLE, TRAILER_SIZE, VALTYPE_F32,
    VALTYPE_F64, VALTYPE_FUNCREF, VALTYPE_I32, VALTYPE_I64, VALTYPE_NAMES, VERSION, ChannelState,
    GlobalState, Header, HeldEvent, PodState, SectionInfo, Snapshot, SnapshotError, TableState,
)
from .reader import ModuleShape, SnapshotReader
from .writer import SnapshotWriter, snapshot_size

__all__ = [
    "SnapshotError", "Header", "GlobalState", "TableState", "ChannelState", "HeldEvent", "PodState",
    "ModuleShape", "Snapshot", "SnapshotWriter", "snapshot_size", "SnapshotReader", "SectionInfo",
    "MAGIC", "VERSION", "HEADER_SIZE", "TRAILER_SIZE", "PAGE_SIZE", "CAUSES",
    "SECTION_MEMORY", "SECTION_GLOBALS", "SECTION_TABLE", "SECTION_CHANNELS", "SECTION_EVENTS",
    "SECTION_NAMES", "VALTYPE_I32", "VALTYPE_I64", "VALTYPE_F32", "VALTYPE_F64", "VALTYPE_FUNCREF",
    "VALTYPE_NAMES", "NULL_FUNC", "MAX_CHANNELS", "MAX_CHANNEL_NAME", "MAX_CHANNEL_HANDLE", "MAX_EVENTS",
    "MAX_EVENT_BYTES", "MAX_GLOBALS", "MAX_TABLES",
]
