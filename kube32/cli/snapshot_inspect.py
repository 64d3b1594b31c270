"""`kube32-cli snapshot inspect FILE [-o json]`: what a K32S snapshot holds.

Prints the header fields and each section (type, length and a summary:
globals with their types and values, table sizes, channel names and handles,
events with topics and sizes), and checks the trailer while reading: on any
refusal it prints what it could read, then the message, and exits 1.
The file streams through SnapshotReader without a memory target, so a large
snapshot costs no more than its small sections.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from kube32.snapshot import (
    NULL_FUNC, SECTION_CHANNELS, SECTION_EVENTS, SECTION_GLOBALS, SECTION_MEMORY, SECTION_NAMES,
    SECTION_TABLE, VALTYPE_F32, VALTYPE_F64, VALTYPE_FUNCREF, VALTYPE_I32, VALTYPE_I64, VALTYPE_NAMES,
    GlobalState, Header, Snapshot, SnapshotError, SnapshotReader,
)

from . import output


def global_value(g: GlobalState) -> Any:
    """The value a global's bits stand for; floats that JSON cannot hold become strings."""
    if g.valtype == VALTYPE_I32:
        return struct.unpack("<i", struct.pack("<I", g.bits & 0xFFFFFFFF))[0]
    if g.valtype == VALTYPE_I64:
        return struct.unpack("<q", struct.pack("<Q", g.bits))[0]
    if g.valtype in (VALTYPE_F32, VALTYPE_F64):
        value = (struct.unpack("<f", struct.pack("<I", g.bits & 0xFFFFFFFF))[0] if g.valtype == VALTYPE_F32
                 else struct.unpack("<d", struct.pack("<Q", g.bits))[0])
        return value if value == value and abs(value) != float("inf") else repr(value)
    if g.valtype == VALTYPE_FUNCREF:
        return None if g.bits in (NULL_FUNC, 0xFFFFFFFFFFFFFFFF) else g.bits
    return g.bits


def header_dict(h: Header) -> dict[str, Any]:
    return {
        "version": h.version,
        "flags": h.flags,
        "imageSha256": h.image_sha256.hex(),
        "memoryBytes": h.memory_bytes,
        "memoryPages": h.memory_pages,
        "podTimeMs": h.pod_time_ms,
        "unixTimeMs": h.unix_time_ms,
        "sectionCount": h.section_count,
    }


def sections_list(snap: Snapshot) -> list[dict[str, Any]]:
    tables = iter(snap.state.tables)
    out = []
    for info in snap.sections:
        entry: dict[str, Any] = {
            "type": info.type, "name": SECTION_NAMES.get(info.type, "unknown"),
            "offset": info.offset, "length": info.length,
        }
        if info.type == SECTION_GLOBALS:
            entry["globals"] = [
                {"index": g.index, "type": VALTYPE_NAMES[g.valtype], "bits": f"0x{g.bits:X}", "value": global_value(g)}
                for g in snap.state.globals
            ]
        elif info.type == SECTION_TABLE:
            table = next(tables)
            entry["table"] = {
                "index": table.index, "size": len(table.entries),
                "nullEntries": sum(1 for e in table.entries if e == NULL_FUNC),
            }
        elif info.type == SECTION_CHANNELS:
            entry["channels"] = [{"handle": c.handle, "name": c.name} for c in snap.state.channels]
        elif info.type == SECTION_EVENTS:
            entry["events"] = [{"topic": e.topic, "payloadBytes": len(e.payload)} for e in snap.state.events]
        elif info.type != SECTION_MEMORY:
            entry["skipped"] = True
        out.append(entry)
    return out


def summary_text(entry: dict[str, Any]) -> str:
    if "globals" in entry:
        return ", ".join(f"{g['index']}: {g['type']} = {g['value']}" for g in entry["globals"]) or "none"
    if "table" in entry:
        t = entry["table"]
        return f"table {t['index']}: {t['size']} entries ({t['nullEntries']} null)"
    if "channels" in entry:
        return ", ".join(f"{c['handle']}: {c['name']}" for c in entry["channels"]) or "none"
    if "events" in entry:
        return ", ".join(f"{e['topic']} ({e['payloadBytes']} bytes)" for e in entry["events"]) or "none"
    if entry["type"] == SECTION_MEMORY:
        return f"{entry['length']} bytes of linear memory"
    return "unknown type, skipped"


def print_human(console: Console, path: str, header: Header | None, snap: Snapshot | None) -> None:
    if header is not None:
        fields = Table(title=f"K32S snapshot {path}", show_header=False, title_justify="left")
        fields.add_column("field", style="bold")
        fields.add_column("value", overflow="fold")
        for key, value in header_dict(header).items():
            fields.add_row(key, str(value))
        console.print(fields)
    if snap is None:
        return
    sections = Table(title="Sections", title_justify="left")
    for column in ("#", "TYPE", "LENGTH", "SUMMARY"):
        sections.add_column(column)
    for number, entry in enumerate(sections_list(snap), 1):
        sections.add_row(str(number), f"{entry['type']} {entry['name']}", str(entry["length"]), summary_text(entry))
    console.print(sections)
    console.print(f"trailer sha256:{snap.sha256.hex()} [green]matches[/green] ({snap.total_size} bytes)")


def inspect_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kube32-cli snapshot inspect", description="Show what a K32S snapshot holds.")
    parser.add_argument("file")
    parser.add_argument("-o", "--output", choices=["json"], help="json for scripts")
    args = parser.parse_args(argv)

    try:
        f = open(args.file, "rb")
    except OSError as err:
        print(f"error: cannot open {args.file}: {err.strerror}", file=sys.stderr)
        return 1
    reader = SnapshotReader(total_size=os.fstat(f.fileno()).st_size)
    snap: Snapshot | None = None
    error: SnapshotError | None = None
    with f:
        try:
            snap = reader.read_from(f)
        except SnapshotError as err:
            error = err
        except OSError as err:
            print(f"error: cannot read {args.file}: {err.strerror}", file=sys.stderr)
            return 1

    if args.output == "json":
        doc: dict[str, Any] = {"file": args.file, "valid": error is None}
        if reader.header is not None:
            doc["header"] = header_dict(reader.header)
        if snap is not None:
            doc["sections"] = sections_list(snap)
            doc["trailer"] = snap.sha256.hex()
            doc["sizeBytes"] = snap.total_size
        if error is not None:
            doc["error"] = {"cause": error.cause, "message": str(error)}
        print(json.dumps(doc, indent=2))
    else:
        print_human(output.console(), args.file, reader.header, snap)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(inspect_main(sys.argv[1:]))
