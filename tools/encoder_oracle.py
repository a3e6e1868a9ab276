"""Drive the real vLLM 0.19.1 scheduler with multimodal requests (encoder budget and cache) as an oracle.

    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 /tmp/vllm-oracle-venv/bin/python tools/encoder_oracle.py \
        --encoder-budget 600 --encoder-cache-size 900 -- \
        --num-requests 80 --num-prefixes 6 --out trace.jsonl --workload-out workload.jsonl
    /tmp/vllm-oracle-venv/bin/python tools/encoder_oracle.py --record tests/golden [ORACLE_DIR]

Everything after `--` goes to the shared oracle driver (drive.py: workload, fake model runner, trace
schema), imported, not copied. This file changes three things around it:

- the workload: each request gets `mm_items` [{"offset", "length", "mm_hash"}] (0 to --mm-max-items
  images, inserted into its prompt after the shared prefix as runs of the placeholder id 151655,
  Qwen2-VL's <|image_pad|>; the image is drawn from a pool of --mm-num-images images of fixed lengths,
  so the same mm hash recurs across requests and the encoder cache is shared); every decision keys on
  crc32 of (seed, req_id), as drive.py's extensions do;
- the scheduler: built by drive.py for the text model, then given the encoder budget and an
  EncoderCacheManager of --encoder-cache-size embeddings, as vLLM's own tests/v1/core/test_scheduler.py
  does for multimodal requests (the budget derivation, compute_mm_encoder_budget, needs a real
  multimodal model's processor: the port implements it and tests it on its own);
  --disable-chunked-mm-input sets SchedulerConfig.disable_chunked_mm_input;
- each request carries MultiModalFeatureSpec(identifier=mm_hash, mm_position=PlaceholderRange(offset,
  length)) (is_embed None: every placeholder token is an embedding), so the block hasher keys its
  blocks with the mm hashes too, and each trace line gets `scheduled_encoder_inputs` {req_id: [item
  index...]} and `free_encoder_mm_hashes` (the SchedulerOutput's), and right after schedule()
  `encoder_num_free_slots` / `encoder_num_freeable_slots` (the EncoderCacheManager's counters).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")

PLACEHOLDER_TOKEN_ID = 151655  # Qwen2-VL / Qwen2.5-VL <|image_pad|> (the model's config.json image_token_id)


def crc(s: str) -> int:
    return zlib.crc32(s.encode())


def image_pool(args) -> list[tuple[str, int]]:
    """(mm_hash, length) of each image; lengths cycle through --mm-lengths."""
    lengths = [int(x) for x in args.mm_lengths.split(",")]
    return [(f"img{k:03d}", lengths[crc(f"len:{k}") % len(lengths)]) for k in range(args.mm_num_images)]


def add_mm_items(workload: list[dict], args, seed: int) -> None:
    """Insert images into the prompts (in place) and record them as `mm_items`."""
    pool = image_pool(args)
    for w in workload:
        key = f"{seed}:{w['req_id']}"
        n = crc(f"{key}:mm_n") % (args.mm_max_items + 1)
        if n == 0:
            continue
        prompt = list(w["prompt_token_ids"])
        # The shared prefix stays text (a system prompt); images go into the request's own part.
        prefix_len = len(prompt) - _suffix_len(w)
        cuts = sorted(prefix_len + crc(f"{key}:mm_cut:{j}") % (len(prompt) - prefix_len + 1) for j in range(n))
        items, out, prev = [], [], 0
        for j, cut in enumerate(cuts):
            mm_hash, length = pool[crc(f"{key}:mm_img:{j}") % len(pool)]
            out.extend(prompt[prev:cut])
            items.append({"offset": len(out), "length": length, "mm_hash": mm_hash})
            out.extend([PLACEHOLDER_TOKEN_ID] * length)
            prev = cut
        out.extend(prompt[prev:])
        w["prompt_token_ids"] = out
        w["mm_items"] = items


def add_encoder_inputs(workload: list[dict], args, seed: int) -> None:
    """Encoder-decoder (--encoder-decoder): every request gets exactly one encoder input at offset 0
    (vLLM's Whisper layout), of a length from --mm-lengths, never shared (its own mm hash), and not
    in the decoder prompt (`in_prompt` false)."""
    lengths = [int(x) for x in args.mm_lengths.split(",")]
    for w in workload:
        n = lengths[crc(f"{seed}:{w['req_id']}:enc_len") % len(lengths)]
        w["mm_items"] = [{"offset": 0, "length": n, "mm_hash": f"audio-{w['req_id']}", "modality": "audio",
                          "in_prompt": False}]


@contextlib.contextmanager
def encoder_decoder_groups(block_size: int):
    """KVCacheConfig with vLLM's encoder-decoder layout: the decoder's self-attention (full) and its
    cross-attention layers (CrossAttentionSpec), one group each."""
    import torch
    import vllm.v1.kv_cache_interface as kci

    real = kci.KVCacheConfig
    attn = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}

    def kv_cache_config(num_blocks, kv_cache_tensors, kv_cache_groups):
        groups = [kci.KVCacheGroupSpec(["layer_0_self"], kci.FullAttentionSpec(**attn)),
                  kci.KVCacheGroupSpec(["layer_0_cross"], kci.CrossAttentionSpec(**attn))]
        return real(num_blocks=num_blocks, kv_cache_tensors=kv_cache_tensors, kv_cache_groups=groups)

    kci.KVCacheConfig = kv_cache_config
    try:
        yield
    finally:
        kci.KVCacheConfig = real


def _suffix_len(w: dict) -> int:
    """The request's own tokens after its shared prefix (drive.py: prefix ids are 10_000 + ...)."""
    prompt = w["prompt_token_ids"]
    n = 0
    for t in reversed(prompt):
        if t >= 10_000:
            break
        n += 1
    return n


def make_features(w: dict):
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return [MultiModalFeatureSpec(data=None, modality=it.get("modality", "image"), identifier=it["mm_hash"],
                                  mm_position=PlaceholderRange(offset=it["offset"], length=it["length"]),
                                  mm_hash=it["mm_hash"])
            for it in w.get("mm_items", ())]


class EncoderScheduler:
    """The real scheduler; records its encoder decisions beside drive.py's trace line."""

    def __init__(self, sched):
        self._sched = sched
        self.records: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._sched, name)

    def schedule(self):
        so = self._sched.schedule()
        ecm = self._sched.encoder_cache_manager
        # EncoderDecoderCacheManager keeps no unreferenced entries: its freeable slots are its free ones.
        freeable = ecm.num_free_slots if self._sched.is_encoder_decoder else ecm.num_freeable_slots
        self.records.append({
            "scheduled_encoder_inputs": {rid: list(ids) for rid, ids in so.scheduled_encoder_inputs.items()},
            "free_encoder_mm_hashes": list(so.free_encoder_mm_hashes),
            "encoder_num_free_slots": ecm.num_free_slots,
            "encoder_num_freeable_slots": freeable,
        })
        return so


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--oracle-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                        "tools", "vllm_oracle"))
    p.add_argument("--encoder-budget", type=int, required=True, help="max_num_encoder_input_tokens")
    p.add_argument("--encoder-cache-size", type=int, required=True, help="embeddings")
    p.add_argument("--disable-chunked-mm-input", action="store_true")
    p.add_argument("--encoder-decoder", action="store_true",
                   help="an encoder-decoder model: one encoder input per request, cross-attention KV group "
                        "(needs drive.py's --no-chunked-prefill --no-prefix-caching, as vLLM forces)")
    p.add_argument("--mm-max-items", type=int, default=3, help="images per request: 0..N")
    p.add_argument("--mm-num-images", type=int, default=12, help="distinct images (mm hashes) in the pool")
    p.add_argument("--mm-lengths", default="16,48,96,160,256", help="placeholder tokens per image")
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1:]
    else:
        own, rest = argv, []
    args = p.parse_args(own)
    longest = max(int(x) for x in args.mm_lengths.split(","))
    if longest > min(args.encoder_budget, args.encoder_cache_size):
        p.error("every image must fit the encoder budget and cache (vLLM's budget is at least the largest item)")
    return args, rest


def run(args, drive_argv: list[str]) -> int:
    sys.path.insert(0, os.path.abspath(args.oracle_dir))
    import drive  # the shared oracle driver

    dargs = drive.parse_args(drive_argv)
    holder: list[EncoderScheduler] = []
    real_build, real_make, real_gen = drive.build_scheduler, drive.make_request, drive.gen_workload

    if args.encoder_decoder and not (dargs.no_chunked_prefill and dargs.no_prefix_caching
                                     and args.disable_chunked_mm_input and not dargs.long_prefill_token_threshold):
        raise SystemExit("--encoder-decoder: vLLM forces chunked prefill, prefix caching and chunked mm input "
                         "off and long_prefill_token_threshold 0; pass --disable-chunked-mm-input and drive.py's "
                         "--no-chunked-prefill --no-prefix-caching")

    def build(dargs_):
        from vllm.v1.core.encoder_cache_manager import EncoderCacheManager, EncoderDecoderCacheManager

        if args.encoder_decoder:
            with encoder_decoder_groups(dargs_.block_size):
                sched, cfg = real_build(dargs_)
            sched.is_encoder_decoder = True
            ecm = EncoderDecoderCacheManager(cache_size=args.encoder_cache_size)
        else:
            sched, cfg = real_build(dargs_)
            ecm = EncoderCacheManager(cache_size=args.encoder_cache_size)
        sched.scheduler_config.disable_chunked_mm_input = args.disable_chunked_mm_input
        sched.max_num_encoder_input_tokens = args.encoder_budget
        sched.encoder_cache_manager = ecm
        holder.append(EncoderScheduler(sched))
        return holder[0], cfg

    def make_request(w, block_hasher, eos):
        feats = make_features(w)
        if not feats:
            return real_make(w, block_hasher, eos)
        # The block hasher reads mm_features at construction: build the request with them.
        from vllm.v1.request import Request

        orig_init = Request.__init__

        def init(self, *a, **kw):
            kw["mm_features"] = feats
            orig_init(self, *a, **kw)

        Request.__init__ = init
        try:
            return real_make(w, block_hasher, eos)
        finally:
            Request.__init__ = orig_init

    def gen(dargs_):
        reqs = real_gen(dargs_)
        (add_encoder_inputs if args.encoder_decoder else add_mm_items)(reqs, args, dargs_.seed)
        return reqs

    from oracle_record import run_patched_drive

    patches = {"build_scheduler": build, "make_request": make_request, "gen_workload": gen}
    return run_patched_drive(drive, drive_argv, patches, dargs.out, lambda: holder[0].records)


# Golden configs (tests/golden/encoder_*/). Own flags start with encoder_ / mm_ / disable_; the rest go
# to drive.py. Images of 16..256 placeholder tokens, up to 3 a request, from a pool of 12.
_BASE = {"num_requests": 80, "num_prefixes": 6, "arrival_spread": 60}
GOLDEN = {
    "encoder_large_budget": {"encoder_budget": 4096, "encoder_cache_size": 8192, **_BASE},
    "encoder_small_budget": {"encoder_budget": 300, "encoder_cache_size": 2048, **_BASE},
    "encoder_small_cache": {"encoder_budget": 1024, "encoder_cache_size": 400, "mm_num_images": 30, **_BASE},
    "encoder_priority_preempt": {"encoder_budget": 512, "encoder_cache_size": 700, "policy": "priority",
                                 "num_blocks": 140, **_BASE},
    "encoder_async": {"encoder_budget": 400, "encoder_cache_size": 600, "async_scheduling": True,
                      "num_blocks": 200, **_BASE},
    "encoder_no_chunked_prefill": {"encoder_budget": 512, "encoder_cache_size": 1024, "no_chunked_prefill": True,
                                   **_BASE},
    "encoder_no_chunked_mm_input": {"encoder_budget": 512, "encoder_cache_size": 1024,
                                    "disable_chunked_mm_input": True, "max_num_batched_tokens": 512,
                                    "max_model_len": 2048, "no_prefix_caching": True, **_BASE},
    "encoder_threshold_async_priority": {"encoder_budget": 300, "encoder_cache_size": 500,
                                         "long_prefill_token_threshold": 128, "async_scheduling": True,
                                         "policy": "priority", "num_blocks": 160, **_BASE},
}
# Encoder-decoder (Whisper's layout, scaled down): one encoder input of 48..320 tokens a request.
_ENCDEC = {"encoder_decoder": True, "disable_chunked_mm_input": True, "no_chunked_prefill": True,
           "no_prefix_caching": True, "mm_lengths": "48,100,200,320", "trace_block_tables": True, **_BASE}
GOLDEN.update({
    "encoder_decoder": {"encoder_budget": 1024, "encoder_cache_size": 1024, "num_blocks": 300, **_ENCDEC},
    "encoder_decoder_small": {"encoder_budget": 400, "encoder_cache_size": 640, "num_blocks": 120,
                              "policy": "priority", **_ENCDEC},
    "encoder_decoder_async": {"encoder_budget": 700, "encoder_cache_size": 700, "num_blocks": 150,
                              "async_scheduling": True, **_ENCDEC},
    # aborts while a step is in flight give encoder slots back after the counters are read
    "encoder_decoder_aborts_async": {"encoder_budget": 500, "encoder_cache_size": 1500, "num_blocks": 200,
                                     "async_scheduling": True, "abort_rate": 0.5, "abort_window": 5,
                                     "abort_after": 3, "abort_preempted_rate": 0.5, **_ENCDEC},
})
OWN_PREFIXES = ("encoder_", "mm_", "disable_")


def record(out_dir: str, oracle_dir: str, only: tuple[str, ...] = ()) -> int:
    """Write OUT_DIR/<name>/{workload.jsonl, trace.jsonl.gz, config.json} for every GOLDEN config
    (the replay takes the encoder_ / disable_ flags; mm_ flags only shape the workload)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from oracle_record import record_goldens

    return record_goldens(out_dir, oracle_dir, GOLDEN, is_own=lambda k: k.startswith(OWN_PREFIXES),
                          parse_args=parse_args, run=run, only=only,
                          is_trace_flag=lambda k: k.startswith(("encoder_", "disable_")),
                          oracle="vllm 0.19.1 Scheduler with multimodal requests (tools/encoder_oracle.py)")



def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--record":  # --record OUT_DIR [ORACLE_DIR]
        default_dir = parse_args(["--encoder-budget", "256", "--encoder-cache-size", "256"])[0].oracle_dir
        return record(argv[1], argv[2] if len(argv) > 2 else default_dir)
    args, rest = parse_args(argv)
    return run(args, rest)


if __name__ == "__main__":
    sys.exit(main())
