"""`multilora run` as a shell user drives it, mostly as a real process: a reader that stops early (`| head`), std
streams that are closed or go away, one file under two names (hard links, `- < out.jsonl`), Ctrl-C twice then
--resume, and input files as editors and scripts leave them (BOM, CRLF, no final newline, a 5 MB line).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from multilora_cli.run.signal_after import TEST_SIGNAL_ENV
from tests.run.helpers import multilora_cmd, read_jsonl, run_cli, run_sub, subprocess_env, write_jsonl

ROWS = [
    {
        "id": f"r{i}",
        "prompt": f"The court held that the {i} tenants",
        "max_tokens": 6,
        **({"adapter": "legal"} if i % 2 else {}),
    }
    for i in range(12)
]


def model_args(model_dir) -> list[str]:
    return ["-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}", "--device", "cpu"]


def shell(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=subprocess_env(), timeout=300)


def test_head_closing_stdout_stops_the_run_with_one_line_and_no_traceback(model_dir, tmp_path):
    # ~300 KB of records: more than a pipe buffer holds, so the run cannot finish its writes before head exits
    # (12 short records all fit in the buffer, and the run then exited 0 whenever it beat head to it)
    pad = "x" * 1500
    inp = write_jsonl(
        tmp_path / "in.jsonl", [{**r, "id": f"r{i}-{pad}", "max_tokens": 2} for i, r in enumerate(ROWS * 16)]
    )
    mult = " ".join(multilora_cmd() + ["run", str(inp), *model_args(model_dir)])
    res = shell(f"{mult} 2>{tmp_path / 'err'} | head -n 2; echo rc=${{PIPESTATUS[0]}}")
    *records, rc = res.stdout.splitlines()
    err = (tmp_path / "err").read_text()
    assert rc == "rc=1", err  # README: the run stops with exit 1 and says so
    assert [json.loads(r)["id"] for r in records] == [f"r0-{pad}", f"r1-{pad}"]
    assert err.strip().splitlines()[-1] == "error: <stdout> was closed by the reader before the run finished"
    assert "Traceback" not in err and "Exception ignored" not in err


def test_a_vanished_or_closed_stderr_does_not_stop_a_run_to_a_file(model_dir, tmp_path):
    # Notes, progress and the summary are diagnostics: `2>&1 | head -c 1` used to make the run exit 1 after all
    # its work (or before any, at the first warning), and with `2>&-` notes were printed among the records.
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    mult = " ".join(multilora_cmd() + ["run", str(inp), *model_args(model_dir), "-a", "gone=/nonexistent"])
    res = shell(
        f"{mult} -o {tmp_path / 'a.jsonl'} 2>&1 | head -c 1 >/dev/null; echo rc=${{PIPESTATUS[0]}}; "
        f"{mult} 2>&- >{tmp_path / 'b.jsonl'}; echo rc=$?"
    )
    assert res.stdout.split() == ["rc=0", "rc=0"], res.stderr
    for name in ("a.jsonl", "b.jsonl"):  # every line of stdout / -o is a record, all of them are there
        assert [r["id"] for r in read_jsonl(tmp_path / name)] == [r["id"] for r in ROWS]


def test_closed_stdin_or_stdout_is_one_clear_fatal_error(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    mult = " ".join(multilora_cmd() + ["run"])
    args = " ".join(model_args(model_dir))
    res = shell(f"{mult} - {args} <&-; echo rc=$?; {mult} {inp} {args} >&-; echo rc=$?")
    lines = res.stderr.strip().splitlines()
    assert res.stdout.split() == ["rc=1", "rc=1"], res.stderr
    assert lines == [
        "error: INPUT is - but stdin is closed (pipe the JSONL in, or give a file path)",
        "error: stdout is closed, so the output records have nowhere to go (give -o PATH)",
    ]


def test_an_output_that_is_the_input_under_another_name_is_refused_before_clobbering(model_dir, tmp_path):
    # A hard link and `- < FILE` escape the path comparison; -o used to truncate the input it was reading.
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    before = inp.read_bytes()
    os.link(inp, tmp_path / "link.jsonl")
    for args, stdin in (
        (["run", str(inp), "-o", str(tmp_path / "link.jsonl")], None),
        (["run", str(inp), "--errors", str(tmp_path / "link.jsonl")], None),
        (["run", "-", "-o", str(inp), "--resume"], inp),
    ):
        with open(stdin or os.devnull, "rb") as f:
            res = run_sub([*args, *model_args(model_dir), "-q"], stdin=f, timeout=120)
        err = res.stderr.decode()
        assert res.returncode == 2 and res.stdout == b"", err
        assert err.count("\n") == 1 and "is the same file as INPUT" in err and "destroy the input" in err, err
        assert inp.read_bytes() == before


def test_two_outputs_hard_linked_to_one_file_are_refused(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    (tmp_path / "out.jsonl").write_bytes(b"")
    os.link(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    res = run_sub(
        [
            "run",
            str(inp),
            *model_args(model_dir),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--errors",
            str(tmp_path / "err.jsonl"),
        ],
        timeout=120,
    )
    assert res.returncode == 2, res.stderr.decode()
    assert "--errors" in res.stderr.decode() and "same file as -o" in res.stderr.decode()


def test_ctrl_c_twice_leaves_whole_lines_no_traceback_and_resume_completes(model_dir, tmp_path):
    rows = [{**r, "id": f"r{i}", "max_tokens": 8} for i, r in enumerate(ROWS * 4)]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    args = ["run", str(inp), *model_args(model_dir), "--max-num-seqs", "1", "-q", "-o", str(out)]
    # the first Ctrl-C: the run sends it itself right after writing its first record (run/signal_after.py)
    env = {**subprocess_env(), TEST_SIGNAL_ENV: "SIGINT:1"}
    # SIGINT at its default, as a terminal's foreground job has it, whatever this process inherited: a job started
    # from a script with `&` runs with SIGINT ignored, Python then installs no KeyboardInterrupt handler, and the
    # run's own Ctrl-C would do nothing
    proc = subprocess.Popen(
        multilora_cmd() + args,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not (out.exists() and out.read_bytes().count(b"\n")):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # the impatient second Ctrl-C, during the cleanup
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 130, err  # (not killed by the signal: it used to be, landing in the interpreter's exit)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    data = out.read_bytes()
    assert data.endswith(b"\n") and 1 <= data.count(b"\n") < len(rows), data[-200:]
    res = run_sub(args + ["--resume"], timeout=300)
    assert res.returncode == 0, res.stderr.decode()
    assert [r["id"] for r in read_jsonl(out)] == [r["id"] for r in rows]  # each line exactly once, in order


def test_stdin_from_a_terminal_says_how_to_end_it(model_dir, tmp_path):
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        multilora_cmd() + ["run", "-", *model_args(model_dir)],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    os.close(slave)
    os.write(master, json.dumps(ROWS[0]).encode() + b"\n\x04")  # one request, then Ctrl-D
    stdout, stderr = proc.communicate(timeout=120)
    os.close(master)
    assert proc.returncode == 0, stderr.decode()
    assert "Ctrl-D to end" in stderr.decode()
    assert [r["id"] for r in read_jsonl(stdout)] == ["r0"]


def test_bom_crlf_no_final_newline_and_5_mb_lines_get_one_short_record_each(model_dir, tmp_path):
    big = "the court held that " * 250_000  # 5 MB on one line
    lines = [
        b'\xef\xbb\xbf{"id": "a", "prompt": "The court", "max_tokens": 3}',
        json.dumps({"id": "big", "prompt": big, "adapter": "nobody"}).encode(),
        b'{"id": "torn", "prompt": "' + big.encode(),
        b"",
        b'{"id": "z", "prompt": "The court", "max_tokens": 3, "adapter": "legal"}',
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b"\r\n".join(lines))
    rc, _, err = run_cli(["run", str(inp), *model_args(model_dir), "-q", "-o", str(out)])
    assert rc == 3, err
    data = out.read_bytes()
    assert max(len(x) for x in data.splitlines()) < 1000  # an error record never echoes the 5 MB
    recs = read_jsonl(data)
    assert [(r["id"], r.get("error", {}).get("code")) for r in recs] == [
        ("a", None),
        ("big", "unknown_adapter"),
        (3, "invalid_json"),
        ("z", None),
    ]
    assert recs[2]["error"]["message"].startswith("line 3: malformed JSON")
    rc, _, err = run_cli(["run", str(inp), *model_args(model_dir), "-q", "-o", str(out), "--resume"])
    assert rc == 3 and out.read_bytes() == data, err  # the ledger matches CRLF lines and the BOM'd first line
