"""What torchrun runs in every training process: ``python -m cifar10_kfp.train._worker SPEC.json``.

Internal (``cifar10_kfp.train.distributed.launch`` writes the spec): no options to parse, so the
library can start its own workers without the command-line package, which it must not import.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(spec_path: str) -> int:
    from cifar10_kfp.train.config import TrainConfig
    from cifar10_kfp.train.engine import train_in_this_process

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(spec_path).read_text())
    config = TrainConfig.from_dict(spec["config"])
    train_in_this_process(config, spec["data"], Path(spec["output_dir"]), spec["checkpoint_uri"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
