"""A window on a program's output: last lines, last bytes, what came after an offset, read in
chunks from files that are still being written, never cutting a character."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathways_api.logs import LogBytes, LogFile, LogWindow, read_window, run_parts


def output(*runs: bytes) -> list:
    return run_parts([(number, LogBytes(data)) for number, data in enumerate(runs, start=1)])


def whole(*runs: bytes) -> str:
    return read_window(output(*runs), LogWindow()).text


def test_runs_follow_one_another_each_after_its_header() -> None:
    assert whole(b"a\n", b"b") == "--- run 1 ---\na\n\n--- run 2 ---\nb"
    assert whole() == ""
    later = run_parts([(2, LogBytes(b"x\n")), (5, LogBytes(b"y\n"))])  # run numbers kept
    assert read_window(later, LogWindow()).text == "--- run 2 ---\nx\n\n--- run 5 ---\ny\n"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (0, ""),
        (1, "c\n"),
        (2, "b\nc\n"),
        (3, "--- run 2 ---\nb\nc\n"),  # across runs: a header is a line
        (4, "\n--- run 2 ---\nb\nc\n"),  # and so is the blank line before it
        (100, "--- run 1 ---\na\n\n--- run 2 ---\nb\nc\n"),
    ],
)
def test_tail_lines_counts_lines_back_from_the_end(lines: int, expected: str) -> None:
    parts = output(b"a\n", b"b\nc\n")
    assert read_window(parts, LogWindow(tail_lines=lines)).text == expected


def test_an_unfinished_last_line_is_a_line() -> None:
    assert read_window(output(b"a\nb\npart"), LogWindow(tail_lines=2)).text == "b\npart"


def test_limit_bytes_keeps_the_last_bytes_and_says_where_they_start() -> None:
    parts = output(b"0123456789")
    window = read_window(parts, LogWindow(limit_bytes=4))
    assert (window.text, window.start, window.end, window.size) == ("6789", 20, 24, 24)
    # Lines are counted inside the limit: a tail longer than it is cut too, and says so.
    cut = read_window(output(b"aaaa\nbb\n"), LogWindow(tail_lines=2, limit_bytes=5))
    assert (cut.text, cut.lines_cut) == ("a\nbb\n", True)
    # Lines that begin right at the limit are whole.
    whole = read_window(output(b"aaaa\nbb\n"), LogWindow(tail_lines=1, limit_bytes=3))
    assert (whole.text, whole.lines_cut) == ("bb\n", False)
    exact = read_window(output(b"aaaa\nbb\n"), LogWindow(tail_lines=2, limit_bytes=8))
    assert (exact.text, exact.lines_cut) == ("aaaa\nbb\n", False)
    assert not read_window(output(b"aaaa\nbb\n"), LogWindow(tail_lines=9)).lines_cut


def test_an_offset_reads_only_what_came_after_it() -> None:
    first = read_window(output(b"one\n"), LogWindow())
    grown = output(b"one\ntwo\n")
    after = read_window(grown, LogWindow(offset=first.end))
    assert after.text == "two\n" and after.start == first.end
    assert read_window(grown, LogWindow(offset=after.end)).text == ""
    assert read_window(grown, LogWindow(offset=10**9)).text == ""  # past the end: nothing
    # More came than one look reads: the last bytes, and the start says what was skipped.
    skipped = read_window(grown, LogWindow(offset=first.end, limit_bytes=2))
    assert skipped.text == "o\n" and skipped.start == skipped.size - 2


def test_a_window_never_cuts_a_character() -> None:
    text = "é€😀\n".encode()  # 2, 3 and 4 bytes
    parts = output(text)
    header = len(b"--- run 1 ---\n")
    # Starting inside a character: the window starts after it.
    for limit in range(1, len(text)):
        window = read_window(parts, LogWindow(limit_bytes=limit))
        assert "\ufffd" not in window.text
        assert text.decode().endswith(window.text)
        assert window.start == window.end - len(window.text.encode())
    # A character whose last bytes are not written yet: the window ends before it.
    for cut in range(1, len(text)):
        window = read_window(output(text[:cut]), LogWindow(offset=header))
        assert "\ufffd" not in window.text
        assert window.end == header + len(window.text.encode())
        assert (
            read_window(output(text), LogWindow(offset=window.end)).text
            == (text.decode()[len(window.text) :])
        )


def test_a_file_is_read_as_long_as_it_was_when_measured(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"x" * 200_000 + b"\nlast\n")  # lines are found across chunks
    log = LogFile(path)
    with path.open("ab") as more:
        more.write(b"written after\n")
    window = read_window(run_parts([(1, log)]), LogWindow(tail_lines=2))
    assert window.text == "x" * 200_000 + "\nlast\n"
    grown = read_window(run_parts([(1, LogFile(path))]), LogWindow(offset=window.end))
    assert grown.text == "written after\n"
    assert LogFile(tmp_path / "missing").size == 0
