"""Choose BandMF's number of bands b before training, from (N, B, T, epsilon) alone.

For each b, sigma(b) is calibrated for the amplified DP-SGD equivalent and multiplied into the
strategy's prefix-sum loss (``expected_error_table``); the b with the smallest product is
printed per epsilon. It reads no data, so choosing b this way costs no privacy.

    python scripts/bandmf_bands.py --n 8000 --batch 256 --steps 62 --eps 1 2 4 8
"""

from __future__ import annotations

import argparse
import json

from dpbench.privacy import default_delta
from dpbench.privacy.banded_mf import expected_error_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, required=True, help="training examples N")
    p.add_argument("--batch", type=int, required=True, help="expected batch size B")
    p.add_argument("--steps", type=int, required=True, help="steps T")
    p.add_argument("--eps", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    p.add_argument("--bands", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--accountant", default="prv")
    args = p.parse_args()
    rows = expected_error_table(args.n, args.batch, args.steps, args.eps, args.bands,
                                default_delta(args.n), args.accountant)
    for eps in args.eps:
        mine = [r for r in rows if r["epsilon"] == eps]
        best = min(mine, key=lambda r: r["optimal"])
        print(json.dumps({"epsilon": eps, "best_bands": best["bands"], "rows": mine}))


if __name__ == "__main__":
    main()
