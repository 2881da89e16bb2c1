"""Write tiny samples of the GSM8K, MATH-500, AIME and GPQA file formats into assets/bench/.

The questions are our own, written for this project (not taken from the benchmarks): they only show
the column layout each loader in backend/eval/benchmarks.py reads, so tests and first-time users have
a file of each format. AIME is written as Parquet to exercise that path; the others as JSONL.

    python assets/make_bench_samples.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "bench"

GSM8K = [
    ("Mia has 3 boxes with 12 pencils each. She gives away 7 pencils. How many pencils does she have left?",
     "3 boxes hold 3 * 12 = <<3*12=36>>36 pencils.\nAfter giving 7 away she has 36 - 7 = <<36-7=29>>29.\n#### 29"),
    ("A bus ticket costs $4 and a train ticket costs $9. Leo buys 2 bus tickets and 3 train tickets. "
     "How much does he spend?", "2 * 4 = <<2*4=8>>8 on buses and 3 * 9 = <<3*9=27>>27 on trains.\n"
                                "8 + 27 = <<8+27=35>>35.\n#### 35"),
    ("A farm sells 1,250 eggs a week. How many eggs does it sell in 4 weeks?",
     "1250 * 4 = <<1250*4=5000>>5000.\n#### 5,000"),
    ("Tom reads 15 pages a day. How many days does he need for a 120-page book?",
     "120 / 15 = <<120/15=8>>8.\n#### 8"),
]

MATH500 = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?", "solution": "$\\frac12+\\frac13=\\frac{3+2}{6}=\\boxed{\\frac{5}{6}}$.",
     "answer": "\\frac{5}{6}", "subject": "Prealgebra", "level": 1, "unique_id": "sample/prealgebra/1.json"},
    {"problem": "Solve for $x$: $3x - 7 = 11$.", "solution": "$3x = 18$, so $x = \\boxed{6}$.",
     "answer": "6", "subject": "Algebra", "level": 1, "unique_id": "sample/algebra/1.json"},
    {"problem": "What is the area of a circle of radius 3?", "solution": "$\\pi r^2 = \\boxed{9\\pi}$.",
     "answer": "9\\pi", "subject": "Geometry", "level": 2, "unique_id": "sample/geometry/1.json"},
    {"problem": "Compute $\\sqrt{50}$ in simplest radical form.", "solution": "$\\sqrt{25\\cdot 2}=\\boxed{5\\sqrt{2}}$.",
     "answer": "5\\sqrt{2}", "subject": "Algebra", "level": 2, "unique_id": "sample/algebra/2.json"},
]

AIME = [
    {"id": 1, "problem": "Find the remainder when $7^{4}$ is divided by $1000$.", "answer": "401"},
    {"id": 2, "problem": "How many positive divisors does $360$ have?", "answer": "24"},
    {"id": 3, "problem": "Find the sum of the first $20$ positive odd integers.", "answer": "400"},
]

GPQA = [
    {"Question": "Which particle carries the electromagnetic force?", "Correct Answer": "The photon",
     "Incorrect Answer 1": "The gluon", "Incorrect Answer 2": "The W boson", "Incorrect Answer 3": "The neutrino",
     "Subdomain": "Physics (sample)"},
    {"Question": "What is the oxidation state of oxygen in hydrogen peroxide?", "Correct Answer": "-1",
     "Incorrect Answer 1": "-2", "Incorrect Answer 2": "0", "Incorrect Answer 3": "+1", "Subdomain": "Chemistry (sample)"},
    {"Question": "Which organelle makes most of a eukaryotic cell's ATP?", "Correct Answer": "The mitochondrion",
     "Incorrect Answer 1": "The ribosome", "Incorrect Answer 2": "The Golgi apparatus",
     "Incorrect Answer 3": "The lysosome", "Subdomain": "Biology (sample)"},
]


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    import pandas as pd

    OUT.mkdir(exist_ok=True)
    _jsonl(OUT / "gsm8k.jsonl", [{"question": q, "answer": a} for q, a in GSM8K])
    _jsonl(OUT / "math500.jsonl", MATH500)
    pd.DataFrame(AIME).to_parquet(OUT / "aime.parquet", index=False)
    _jsonl(OUT / "gpqa.jsonl", GPQA)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
