"""`python -m pcieprof.sim.calibration [--fit] [--readme docs/fabric-model.md]`: print the calibration error
table (markdown).

--fit first refits the fitted parameters on the `fit` points and rewrites params.toml;
--readme FILE replaces the table in FILE (docs/fabric-model.md) with the new one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pcieprof.sim import calibration


def main(argv: list[str]) -> int:
    if "--fit" in argv:
        params = calibration.fit()
        calibration.write_fitted(params)
        for _name, keys, _q in calibration.STAGES:
            print("  ".join(f"{s}.{k}={params[s][k]:.4g}" for s, k in keys), file=sys.stderr)
    if "--readme" in argv:
        target = Path(argv[argv.index("--readme") + 1])
        changed = calibration.update_readme(target)
        print(f"{target}: {'table updated' if changed else 'table already current'}", file=sys.stderr)
    print(calibration.markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
