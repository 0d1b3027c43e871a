"""Job-log recognition throughput: megabytes of log per CPU second, benign and busy.

The agent may be fed 50 MB/s of a job's output; a benign line (one holding none of the
catalogue's keywords) must cost next to nothing. Measured with the packaged catalogue,
on text fed in 1 MiB chunks of whole lines, in CPU time (``time.process_time``):

- **benign**: progress lines of four trainers (HF Trainer, mmengine, Megatron, a plain
  ``loss=`` print), none holding a keyword;
- **busy**: the same with three lines in seven that hold a keyword and are not failures
  (``grad_norm: nan``, an NCCL INFO line, DeepSpeed's skipped step at a large loss scale):
  each such line is tried against the signatures.

    python -m bench.log_recognition_bench [--megabytes N]
"""

from __future__ import annotations

import argparse
import time

from sn_monitor.joblog.context import Origin
from sn_monitor.joblog.recognition import Recognizer

BENIGN = [
    "{'loss': 0.2051, 'grad_norm': 1.3, 'learning_rate': 9.774074342405685e-06, 'epoch': 0.53}",
    "10/30 22:19:57 - mmengine - INFO - Epoch(train) [1][240/735]  lr: 1.9813e-04  eta: 2:44:49"
    "  time: 2.8874  data_time: 0.0042  memory: 10762  loss: 2.5128  grad_norm: 0.4",
    " iteration     5426/  250000 | consumed samples:        43408 | elapsed time per iteration"
    " (ms): 4247.9 | learning rate: 2.999E-04 | global batch size:     8 | lm loss: 2.3E+00 |"
    " loss scale: 1.0 | grad norm: 0.3 |",
    "[rank3]: step 1234 loss=2.17 lr=0.0003 tokens/s=12345",
]
KEYWORD_NOT_FAILURE = [
    "{'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 9.774074342405685e-06, 'epoch': 0.53}",
    "gpu2:46654:46654 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:12.12.12.102<0>",
    "[2024-09-11 17:52:18,030] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
    "Rank 0 Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648",
]
CHUNK = 1 << 20


def throughput(recognizer: Recognizer, lines: list[str], megabytes: int) -> tuple[float, int]:
    """MB of ``lines`` recognised per CPU second, and how many findings there were."""
    text = "\n".join(lines * (CHUNK // sum(map(len, lines)) + 1))
    chunk = text[:text.rfind("\n", 0, CHUNK) + 1]
    stream = recognizer.stream("bench.log", Origin(), year=2026)
    fed = findings = 0
    started = time.process_time()
    while fed < megabytes * 1e6:
        findings += len(stream.feed(chunk))
        fed += len(chunk)
    return fed / 1e6 / (time.process_time() - started), findings


def main() -> None:
    """Print both figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=50)
    args = parser.parse_args()
    recognizer = Recognizer()
    for name, lines in (("benign", BENIGN), ("busy", BENIGN + KEYWORD_NOT_FAILURE)):
        rate, findings = throughput(recognizer, lines, args.megabytes)
        print(f"{name}: {rate:.1f} MB/s per CPU second ({findings} findings)")


if __name__ == "__main__":
    main()
