"""Run in vLLM's own environment: parse an argv (JSON list, after ``vllm``) with the real ``vllm serve``
parser, without starting anything, and print the parsed values the argv-injection test reads."""

import json
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser(prog="vllm")
ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
args = parser.parse_args(json.loads(sys.argv[1]))
keys = ("model_tag", "revision", "trust_remote_code", "tokenizer", "max_model_len", "speculative_config")
print(json.dumps({k: getattr(args, k, None) for k in keys}, default=str))
