"""Real ``vllm bench serve --save-result`` files of one server, for ``engine sim check``.

Runs vLLM's own benchmark client (the engine venv's ``vllm bench serve``) against one
server at several Poisson request rates, one file per rate, each with ``--save-detailed``
(per-request lengths and send times), the first rate also without it. The files are
vLLM's format exactly as this vLLM writes it; tests/plan/test_plan_check.py checks and
fits on them. The server is either

- the CPU vLLM of ``vllm-obs engine setup`` (the tiny random-weight Llama; its
  ``config.json`` is copied beside the files, and ``cpu-host.yaml`` describes the CPU as
  a "GPU"): the real engine and API server, on a machine whose two cores other work
  shares, so its figures carry that machine's scheduling; or
- with ``--sim-host CALIBRATION``, ``vllm-obs engine sim`` (an H100 and Llama-3.1-8B)
  running a host calibration that differs from the built-in one: a host whose true
  corrections are known, so a fit on some of its rates can be seen to recover them (its
  files keep every field but ``generated_texts``, the simulator's fixed word cycle).

    python -m bench.sim_calibration_capture --out tests/data/vllm-bench-serve
    python -m bench.sim_calibration_capture --out tests/data/vllm-bench-serve \
        --sim-host tests/data/vllm-bench-serve/sim-host-truth.json --rates 4 8 16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from obs.engines.server import VllmServer
from obs.engines.setup import EnginePaths, engine_environment, ensure_engine
from obs.engines.sim.process import SimServer

RATES = (2.0, 4.0, 8.0)
SIM = ["--gpu", "H100", "--model", "llama-3.1-8b", "--served-model-name", "tiny"]


def command(
    engine: EnginePaths,
    url: str,
    rate: float,
    out: Path,
    *,
    detailed: bool,
    prompts: int,
    lengths: tuple[int, int] = (96, 24),
) -> list[str]:
    cmd = [str(engine.python), str(engine.launcher), "bench", "serve"]
    cmd += ["--backend", "openai", "--endpoint", "/v1/completions"]
    cmd += ["--base-url", url, "--model", "tiny", "--tokenizer", str(engine.model_dir)]
    cmd += ["--dataset-name", "random", "--random-input-len", str(lengths[0])]
    cmd += ["--random-output-len", str(lengths[1])]
    cmd += ["--ignore-eos", "--num-prompts", str(prompts), "--request-rate", str(rate)]
    cmd += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--seed", "1", "--disable-tqdm"]
    cmd += ["--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    return cmd + (["--save-detailed"] if detailed else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the result files")
    p.add_argument("--prompts", type=int, default=40, help="requests per rate (default 40)")
    p.add_argument("--rates", type=float, nargs="+", default=RATES, help="requests/s")
    p.add_argument(
        "--sim-host",
        type=Path,
        metavar="CALIBRATION",
        help="benchmark `engine sim` (H100, Llama-3.1-8B) running this host calibration",
    )
    args = p.parse_args(argv)
    engine = ensure_engine(progress=lambda m: print(m, file=sys.stderr))
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "capture.log"
    server: VllmServer | SimServer
    if args.sim_host is None:
        server = VllmServer(engine.model_dir, log_path=log, max_model_len=512).start()
        prefix, lengths = "rate", (96, 24)
        runs = [(rate, True) for rate in args.rates] + [(args.rates[0], False)]
    else:
        server = SimServer([*SIM, "--calibration", str(args.sim_host)], log_path=log).start()
        prefix, lengths = "sim-h100-rate", (512, 128)
        runs = [(rate, True) for rate in args.rates]
    try:
        for rate, detailed in runs:
            name = f"{prefix}{rate:g}{'' if detailed else '-summary'}.json"
            cmd = command(
                engine,
                server.url,
                rate,
                args.out / name,
                detailed=detailed,
                prompts=args.prompts,
                lengths=lengths,
            )
            env = engine_environment(os.environ)
            with open(log, "ab") as fh:
                subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=True)
            if args.sim_host is not None:  # its answers are 128 words of a fixed cycle each
                doc = json.loads((args.out / name).read_text(encoding="utf-8"))
                del doc["generated_texts"]
                (args.out / name).write_text(json.dumps(doc) + "\n", encoding="utf-8")
    finally:
        server.stop()
    if args.sim_host is None:
        shutil.copy(engine.model_dir / "config.json", args.out / "config.json")
    log.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
