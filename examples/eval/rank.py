"""Rank adapters by multiple-choice accuracy with ONE `multilora run` (scoring lines, examples/eval/README.md).

    python examples/eval/rank.py lines questions.jsonl legal medical code base > eval.jsonl
    multilora run eval.jsonl --adapters legal,medical,code -o scores.jsonl
    python examples/eval/rank.py score questions.jsonl scores.jsonl

`lines`: one scoring line {"id": "ADAPTER/QID/CHOICE", "adapter", "prompt": context, "continuation": choice} per
(adapter, question, choice). `score`: per adapter, accuracy (the choice with the highest logprob is the answer,
lm-evaluation-harness' `acc`) and `acc_norm` (logprob per character of the choice), overall and per domain.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def lines(questions: list[dict], adapters: list[str]) -> None:
    for a in adapters:
        for q in questions:
            for i, choice in enumerate(q["choices"]):
                row = {"id": f"{a}/{q['qid']}/{i}", "adapter": a, "prompt": q["context"], "continuation": choice}
                print(json.dumps(row))


def score(questions: list[dict], records: list[dict]) -> None:
    by_q = {q["qid"]: q for q in questions}
    lp: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in records:
        if "error" in r:
            sys.exit(f"line {r['id']} failed: {r['error']['message']}")
        adapter, qid, i = r["id"].split("/")
        lp[adapter, qid][int(i)] = r["logprob"]
    hits: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for (adapter, qid), scores in lp.items():
        q = by_q[qid]
        acc = max(scores, key=scores.get) == q["answer"]
        norm = max(scores, key=lambda i: scores[i] / len(q["choices"][i])) == q["answer"]
        for key in ("all", q["domain"]):
            h = hits[adapter][key]
            h[0], h[1], h[2] = h[0] + acc, h[1] + norm, h[2] + 1
    domains = sorted({q["domain"] for q in questions})
    print(f"{'adapter':<10} {'acc':>6} {'acc_norm':>9} " + " ".join(f"{d:>8}" for d in domains))
    for adapter in sorted(hits, key=lambda a: -hits[a]["all"][0]):
        h = hits[adapter]
        row = f"{adapter:<10} {h['all'][0] / h['all'][2]:>6.2f} {h['all'][1] / h['all'][2]:>9.2f} "
        print(row + " ".join(f"{h[d][0] / h[d][2]:>8.2f}" for d in domains))


def main(argv: list[str]) -> None:
    if len(argv) >= 3 and argv[0] == "lines":
        lines(read_jsonl(argv[1]), argv[2:])
    elif len(argv) == 3 and argv[0] == "score":
        score(read_jsonl(argv[1]), read_jsonl(argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
