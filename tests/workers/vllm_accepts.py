"""Run by the vLLM venv's interpreter (tests/workers/test_vllm_accepts.py): each argv on stdin (a JSON list
of lists) through vLLM's own OpenAI-server argument parser and engine-config construction, the path
``vllm serve`` takes before it loads weights; one JSON verdict per argv on stdout."""

import json
import sys

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

verdicts = []
for argv in json.load(sys.stdin):
    try:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        spec = config.speculative_config
        verdicts.append(
            {
                "ok": True,
                "method": spec.method if spec else None,
                "num_speculative_tokens": spec.num_speculative_tokens if spec else 0,
                "schedule": [list(r) for r in spec.num_speculative_tokens_per_batch_size or []] if spec else [],
                "max_num_seqs": config.scheduler_config.max_num_seqs,
                "drafter_backend": spec.attention_backend.name if spec and spec.attention_backend else None,
                "target_backend": config.attention_config.backend.name if config.attention_config.backend else None,
            }
        )
    except (Exception, SystemExit) as exc:  # argparse exits on a bad flag
        verdicts.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
print("VERDICTS " + json.dumps(verdicts))
