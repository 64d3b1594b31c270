"""`kube32-cli snapshot inspect`: header, sections, summaries, trailer check."""

from __future__ import annotations

import json

from kube32.cli.snapshot_inspect import inspect_main
from tests.unit.test_snapshot import GOLDEN_FULL, IMAGE, u16, u32, with_trailer


def test_json_output_lists_header_and_sections(tmp_path, capsys):
    path = tmp_path / "pod.k32s"
    path.write_bytes(GOLDEN_FULL)
    assert inspect_main([str(path), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is True
    assert doc["header"] == {
        "version": 1, "flags": 0, "imageSha256": IMAGE.hex(), "memoryBytes": 5, "memoryPages": 1,
        "podTimeMs": 987_654_321, "unixTimeMs": 1_700_000_000_000, "sectionCount": 5,
    }
    names = [(s["name"], s["length"]) for s in doc["sections"]]
    assert names == [("GLOBALS", 39), ("TABLE", 16), ("CHANNELS", 9), ("EVENTS", 19), ("MEMORY", 5)]
    globals_ = doc["sections"][0]["globals"]
    assert globals_[0] == {"index": 0, "type": "i32", "bits": "0x10000", "value": 65536}
    assert globals_[1]["type"] == "f64" and globals_[1]["value"] == "nan"
    assert globals_[2]["value"] == 2
    assert doc["sections"][1]["table"] == {"index": 0, "size": 2, "nullEntries": 1}
    assert doc["sections"][2]["channels"] == [{"handle": 7, "name": "log"}]
    assert doc["sections"][3]["events"] == [{"topic": "sensor/temp", "payloadBytes": 2}]
    assert doc["trailer"] == GOLDEN_FULL[-32:].hex() and doc["sizeBytes"] == len(GOLDEN_FULL)


def test_human_output(tmp_path, capsys):
    path = tmp_path / "pod.k32s"
    header = bytearray(GOLDEN_FULL[:68])
    header[64:68] = u32(6)
    path.write_bytes(with_trailer(bytes(header) + u16(9) + u32(3) + b"???" + GOLDEN_FULL[68:-32]))
    assert inspect_main([str(path)]) == 0
    out = capsys.readouterr().out
    for text in ("memoryPages", "GLOBALS", "0: i32 = 65536", "7: log", "sensor/temp (2 bytes)",
                 "table 0: 2 entries", "unknown type, skipped", "matches"):
        assert text in out, text


def test_damaged_file_exits_1_with_the_message(tmp_path, capsys):
    path = tmp_path / "pod.k32s"
    path.write_bytes(GOLDEN_FULL[:-1] + bytes([GOLDEN_FULL[-1] ^ 1]))
    assert inspect_main([str(path)]) == 1
    captured = capsys.readouterr()
    assert "memoryBytes" in captured.out  # the header still shows
    assert "the snapshot's trailer does not match its contents (damaged in transfer or storage)" in captured.err
    assert inspect_main([str(path), "-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False and doc["error"]["cause"] == "trailer"


def test_missing_and_truncated_files(tmp_path, capsys):
    assert inspect_main([str(tmp_path / "nope")]) == 1
    path = tmp_path / "cut.k32s"
    path.write_bytes(GOLDEN_FULL[:100])
    assert inspect_main([str(path)]) == 1
    assert "truncated" in capsys.readouterr().err
