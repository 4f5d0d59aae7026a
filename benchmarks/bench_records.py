"""Logprob records on the host: building + encoding a line's record, per generated token, before vs now (CPU).

    python -m benchmarks.bench_records                          # 3 shapes x k 0, 5, 20; ~20 s on one core
    python -m benchmarks.bench_records --tokens 64 --k 5 --repeats 3 --out records.json   # quick
    python -m benchmarks.bench_records --shapes simple --k 5 --loop-ab    # + inline vs a writer thread

A record is built and encoded on the thread that runs the engine's steps (run/job.py `_on_result` -> the
format's ok_record -> io/writer.OrderedWriter.put -> encode_record), so its cost per token comes straight off a
run's token rate (at 16k tokens/s a token has 62 us in all). For each shape (simple "logprobs"; OpenAI
/v1/completions' legacy object; /v1/chat/completions' content list with bytes) and each k, a line of `--tokens`
generated tokens with k top logprobs each (token ids drawn Zipf-like from a `--vocab` vocabulary of word-like
texts with some non-ASCII ones, so a run's token-text cache sees repeats as it does in a real run):
- before: what the run did until now (copied below as the baseline): a dict per entry and per top token
  (run/logprobs.entry), the format's shape built from them, json.dumps of the record;
- now: run/logprobs.line_logprobs + the format's ok_record (logprobs written as JSON text from the entries,
  io/logprob_json.py) + io/record_json.encode_record.
Both arms produce the same bytes (checked here once per case; tests/io/test_logprob_json.py checks it on random
entries). Arms are interleaved `--repeats` times, best of each kept; us per generated token and the ratio.
`--loop-ab` adds a step loop finishing one such line a step, records built inline vs on a writer thread (GIL).
"""

from __future__ import annotations

import gc
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.timing import command_line, ints, parser
from multilora_cli.engine.request import Result, Sample, TokenLogprob
from multilora_cli.io.line import LineSpec
from multilora_cli.io.openai_batch import CHAT, COMPLETIONS, OpenAIBatchFormat
from multilora_cli.io.record_json import encode_record
from multilora_cli.io.simple import SimpleFormat
from multilora_cli.run.logprobs import line_logprobs

SHAPES = ("simple", "legacy", "chat")


# -- before: the dict path as the run built it until now ----------------------------------------------------------
def old_entry(t: TokenLogprob) -> dict:
    top = [{"id": i, "token": s, "logprob": v} for i, s, v in t.top]
    return {"id": t.id, "token": t.token, "logprob": t.logprob, "top_logprobs": top}


def old_legacy(entries: list[dict], text_offset: int) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    at = text_offset
    for e in entries:
        tokens.append(e["token"])
        lps.append(e["logprob"])
        tops.append(None if e["logprob"] is None else {t["token"]: t["logprob"] for t in e["top_logprobs"]})
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _old_chat_token(e: dict) -> dict:
    return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode("utf-8"))}


def old_chat(entries: list[dict]) -> dict:
    content = [{**_old_chat_token(e), "top_logprobs": [_old_chat_token(t) for t in e["top_logprobs"]]} for e in entries]
    return {"content": content, "refusal": None}


def old_line(fmt, shape: str, spec: LineSpec, res: Result) -> bytes:
    """The record's line as before: the format's record without logprobs, the dict shapes put in, json.dumps."""
    rec = fmt.ok_record(spec, res.text, res.finish_reason, res.prompt_tokens, res.completion_tokens)
    entries = [old_entry(t) for t in res.samples[0].logprobs]
    if shape == "simple":
        usage = rec.pop("usage")  # (key order: logprobs before usage)
        rec["logprobs"], rec["usage"] = entries, usage
    else:
        choice = rec["response"]["body"]["choices"][0]
        choice["logprobs"] = old_chat(entries) if shape == "chat" else old_legacy(entries, 12)
    try:
        return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(rec, ensure_ascii=True) + "\n").encode("ascii")


def new_line(fmt, spec: LineSpec, res: Result) -> bytes:
    rec = fmt.ok_record(
        spec, res.text, res.finish_reason, res.prompt_tokens, res.completion_tokens, logprobs=line_logprobs(res)
    )
    return encode_record(rec)


# -- workload -----------------------------------------------------------------------------------------------------
def vocabulary(n: int, rng: random.Random) -> list[str]:
    """Word-like token texts: mostly ASCII pieces with a leading space, one in 17 with a non-ASCII piece, and the
    last 128 ids byte tokens that each read U+FFFD (as in byte-level BPE vocabularies; drawn rarely below)."""
    odd = ["é", "日本", "🙂", "\n", '"', "ß"]
    texts: dict[str, None] = {}  # (distinct, as a vocabulary's texts are but for its byte tokens)
    while len(texts) < n:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 7)))
        texts[(" " if rng.random() < 0.6 else "") + word + (rng.choice(odd) if len(texts) % 17 == 0 else "")] = None
    out = list(texts)
    out[-128:] = ["\ufffd"] * min(n, 128)
    return out


def f32(v: float) -> float:
    """A logprob as the engine hands it: an fp32 row's value as a Python float (17 significant digits in repr)."""
    return float(np.float32(v))


def line_result(texts: list[str], tokens: int, k: int, rng: random.Random) -> Result:
    """One finished line of `tokens` generated tokens, k top logprobs each (ids Zipf-like: a few are frequent)."""
    v = len(texts)

    def draw() -> int:
        return min(v - 1, int(rng.paretovariate(1.1)) - 1)

    entries = []
    for _ in range(tokens):
        top = sorted({draw() for _ in range(k * 2)}, key=lambda _: rng.random())[:k]
        lps = sorted((f32(-rng.expovariate(0.5)) for _ in top), reverse=True)
        tid = top[0] if top and rng.random() < 0.7 else draw()
        lp = lps[0] if top and tid == top[0] else f32(-rng.expovariate(0.3))
        entries.append(TokenLogprob(tid, lp, [(i, texts[i], p) for i, p in zip(top, lps)], texts[tid]))
    ids = [e.id for e in entries]
    text = "".join(e.token for e in entries)
    sample = Sample(0, text, ids, "length", tokens, entries)
    return Result(0, "line-1", "legal", text, ids, "length", 12, tokens, samples=[sample])


def case(shape: str, k: int, args, rng: random.Random) -> dict:
    texts = vocabulary(args.vocab, rng)
    results = [line_result(texts, args.tokens, k, rng) for _ in range(args.lines)]
    if shape == "simple":
        fmt, spec = SimpleFormat(), LineSpec(0, 1, "line-1", adapter="legal")
    else:
        url = CHAT if shape == "chat" else COMPLETIONS
        fmt, spec = (
            OpenAIBatchFormat(),
            LineSpec(0, 1, "req-1", meta={"url": url, "model": "legal", "prompt_chars": 12}),
        )
    ref_fmt = type(fmt)()
    for res in results:  # also warms the token-text cache, as the first lines of a run do
        a, b = old_line(ref_fmt, shape, spec, res), new_line(fmt, spec, res)
        if shape != "simple":  # the `created` time may tick between the two
            a, b = (json.loads(x) for x in (a, b))
            a["response"]["body"]["created"] = b["response"]["body"]["created"]
        if a != b:
            sys.exit(f"bench_records: {shape} k {k}: the new line differs from the old one")
    best = {"before": math.inf, "now": math.inf}
    for _ in range(args.repeats):
        for arm in best:
            gc.collect()  # (neither arm pays for the other's garbage)
            t0 = time.perf_counter()
            for res in results:
                if arm == "before":
                    old_line(ref_fmt, shape, spec, res)
                else:
                    new_line(fmt, spec, res)
            best[arm] = min(best[arm], time.perf_counter() - t0)
    n = args.tokens * args.lines
    before, now = best["before"] / n * 1e6, best["now"] / n * 1e6
    return {"shape": shape, "k": k, "before_us_per_token": before, "now_us_per_token": now, "speedup": before / now}


def loop_ab(args, rng: random.Random) -> dict:
    """Records built on the step loop vs on a writer thread, under the GIL. A step is `--step-python-us` of
    Python work (the host's launches and bookkeeping) then `--step-wait-us` waiting with the GIL released (the
    device step, a CUDA sync); each step finishes one line (`--tokens` tokens, simple format, k 5). Inline: the
    record is built and encoded on the loop; thread: the Result goes through a queue and a thread builds and
    encodes it (what the writer could do). Reports the loop's us per step for both and for no records."""
    import queue
    import threading

    texts = vocabulary(args.vocab, rng)
    results = [line_result(texts, args.tokens, 5, rng) for _ in range(args.lines)]
    fmt, spec = SimpleFormat(), LineSpec(0, 1, "line-1", adapter="legal")
    for res in results:
        new_line(fmt, spec, res)

    def python_work(us: float) -> None:
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass

    def loop(handle) -> float:
        t0 = time.perf_counter()
        for res in results * 4:
            python_work(args.step_python_us)
            time.sleep(args.step_wait_us * 1e-6)
            handle(res)
        return (time.perf_counter() - t0) / (4 * len(results)) * 1e6

    def threaded() -> float:
        q: queue.SimpleQueue = queue.SimpleQueue()

        def drain() -> None:
            while (res := q.get()) is not None:
                new_line(fmt, spec, res)

        th = threading.Thread(target=drain)
        th.start()
        us = loop(q.put)
        q.put(None)
        th.join()
        return us

    best = {"none": math.inf, "inline": math.inf, "thread": math.inf}
    for _ in range(args.repeats):
        best["none"] = min(best["none"], loop(lambda res: None))
        best["inline"] = min(best["inline"], loop(lambda res: new_line(fmt, spec, res)))
        best["thread"] = min(best["thread"], threaded())
    return {f"{k}_us_per_step": v for k, v in best.items()}


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--tokens", type=int, default=256, help="generated tokens per line")
    p.add_argument("--lines", type=int, default=16, help="lines per timed pass")
    p.add_argument("--k", type=ints, default=[0, 5, 20], help="top logprobs per token (comma list)")
    p.add_argument("--shapes", default=",".join(SHAPES), help="simple,legacy,chat")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the report here (JSON)")
    p.add_argument("--loop-ab", action="store_true", help="also: records on the step loop vs on a writer thread")
    p.add_argument("--step-python-us", type=float, default=3000.0)
    p.add_argument("--step-wait-us", type=float, default=7000.0)
    args = p.parse_args(argv)
    rows = []
    t0 = time.perf_counter()
    print(f"{'shape':>7} {'k':>3} {'before us/tok':>14} {'now us/tok':>11} {'speedup':>8}")
    for shape in args.shapes.split(","):
        for k in args.k:
            r = case(shape, k, args, random.Random(args.seed))
            rows.append(r)
            print(
                f"{shape:>7} {k:>3} {r['before_us_per_token']:>14.2f} {r['now_us_per_token']:>11.2f} {r['speedup']:>7.2f}x"
            )
    loop = None
    if args.loop_ab:
        loop = loop_ab(args, random.Random(args.seed))
        print("step loop, us per step: " + ", ".join(f"{k} {v:.0f}" for k, v in loop.items()))
    if args.out is not None:
        report = {
            "command": command_line("benchmarks.bench_records", argv),
            "python": sys.version.split()[0],
            "tokens": args.tokens,
            "lines": args.lines,
            "vocab": args.vocab,
            "rows": rows,
            "loop_ab": loop,
            "seconds": time.perf_counter() - t0,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
