#!/usr/bin/env python3
"""Writes a Triton model repository entry that serves a tlaloc artifact with the `tlaloc` backend.

    python3 scripts/triton_model_repo.py --artifact ART --repo REPO --name NAME --mode generate
    python3 scripts/triton_model_repo.py --artifact ART --repo REPO --name NAME --mode sequence \
        --max-batch-size 4 --idle-ms 5000

makes REPO/NAME/config.pbtxt and the version directory REPO/NAME/1/. Generate mode is decoupled
and takes Triton's vLLM-backend inputs (`text_input`, `stream`, `sampling_parameters`,
`exclude_input_in_output`) and gives `text_output`, `finish_reason` and `output_ids`. Sequence
mode runs under the sequence batcher (oldest strategy, START / END / CORRID controls, CORRID
UINT64) and takes `input_ids` (a sequence's new tokens) and `sampling_parameters`, and gives
`output_ids` and `finish_reason`. `--set KEY=VALUE` overrides or adds a raw config line
(for tests of the backend's refusals).
"""

import argparse
import json
import os
import sys
from pathlib import Path


def max_decode_batch(artifact: Path) -> int:
    manifest = json.loads((artifact / "tlaloc-serving.json").read_text())
    return int(manifest["ladder"]["maxBatch"])


def parameters(args) -> str:
    params = {"artifact": str(Path(args.artifact).resolve())}
    if args.plugin:
        params["plugin"] = str(Path(args.plugin).resolve()) if os.path.sep in args.plugin else args.plugin
    if args.compile_cache:
        params["compile_cache"] = str(Path(args.compile_cache).resolve())
    for extra in args.parameter:
        key, _, value = extra.partition("=")
        params[key] = value
    return "\n".join(
        f'parameters {{ key: "{k}" value {{ string_value: {json.dumps(v)} }} }}' for k, v in params.items()
    )


def generate_config(args) -> str:
    return f"""name: "{args.name}"
backend: "tlaloc"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1 ] }}
]
instance_group [ {{ count: {args.instances} kind: KIND_CPU }} ]
{parameters(args)}
"""


def sequence_config(args) -> str:
    corrid = args.corrid_type
    return f"""name: "{args.name}"
backend: "tlaloc"
max_batch_size: {args.max_batch_size}
sequence_batching {{
  oldest {{ max_candidate_sequences: {args.max_candidate_sequences} max_queue_delay_microseconds: 0 }}
  max_sequence_idle_microseconds: {args.idle_ms * 1000}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }}{"" if args.no_corrid else f''',
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}'''}
  ]
}}
input [
  {{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [
  {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ count: {args.instances} kind: KIND_CPU }} ]
{parameters(args)}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", required=True, help="the tlaloc artifact directory")
    p.add_argument("--repo", required=True, help="the model repository directory")
    p.add_argument("--name", required=True, help="the model name")
    p.add_argument("--mode", choices=["generate", "sequence"], required=True)
    p.add_argument("--plugin", help="PJRT plugin: auto, cpu, cuda, rocm, tpu or a path (default auto)")
    p.add_argument("--compile-cache", help="directory for compiled executables")
    p.add_argument("--max-batch-size", type=int, help="sequence mode: default the artifact's top decode batch")
    p.add_argument("--max-candidate-sequences", type=int, default=64, help="sequence mode (default 64)")
    p.add_argument("--idle-ms", type=int, default=60000, help="sequence mode: idle timeout (default 60000)")
    p.add_argument("--instances", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--corrid-type", default="TYPE_UINT64", help=argparse.SUPPRESS)
    p.add_argument("--no-corrid", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--parameter", action="append", default=[], help=argparse.SUPPRESS)
    args = p.parse_args()
    artifact = Path(args.artifact)
    if not (artifact / "tlaloc-serving.json").is_file():
        print(f"{artifact} is not a tlaloc artifact (no tlaloc-serving.json)", file=sys.stderr)
        return 1
    if args.max_batch_size is None:
        args.max_batch_size = max_decode_batch(artifact)
    model = Path(args.repo) / args.name
    (model / "1").mkdir(parents=True, exist_ok=True)
    config = generate_config(args) if args.mode == "generate" else sequence_config(args)
    (model / "config.pbtxt").write_text(config)
    print(model / "config.pbtxt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
