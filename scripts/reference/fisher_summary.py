"""The summary metrics of a Fisher kernel file the trainer wrote (`fisher/step_N.json`), in
float64 with numpy, as tests/fisher_kernel.rs compares them: the trace, the three largest
eigenvalues (numpy.linalg.eigvalsh), the mean correlation K_ij / sqrt(K_ii K_jj) over pairs
i < j whose diagonals are positive, and the participation ratio (sum of eigenvalues)^2 / sum
of squared eigenvalues. Prints one JSON object."""

import json
import sys

import numpy as np


def main(path):
    with open(path) as f:
        k = np.array(json.load(f)["kernel"], dtype=np.float64)
    eigenvalues = np.linalg.eigvalsh(k)[::-1]
    diagonal = np.diag(k)
    pairs = [(i, j) for i in range(len(k)) for j in range(i + 1, len(k)) if diagonal[i] > 0 and diagonal[j] > 0]
    correlations = [k[i, j] / np.sqrt(diagonal[i] * diagonal[j]) for i, j in pairs]
    top = [float(v) for v in eigenvalues[:3]] + [None] * max(0, 3 - len(eigenvalues))
    print(json.dumps({
        "trace": float(np.trace(k)),
        "top_eigenvalues": top,
        "largest": float(np.abs(eigenvalues).max()),
        "mean_offdiag_correlation": float(np.mean(correlations)) if correlations else None,
        "effective_rank": float(eigenvalues.sum() ** 2 / (eigenvalues ** 2).sum()),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
