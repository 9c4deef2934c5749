"""Engine configuration: one frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass, fields

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_DEVICES = ("auto", "cpu", "cuda")
_ATTENTION_BACKENDS = ("auto", "torch", "triton")
_LOAD_FORMATS = ("auto", "dummy")
_SPECULATIVE = ("none", "ngram")
_WEIGHT_QUANTIZATIONS = ("none", "fp8")
_KV_CACHE_DTYPES = ("auto", "fp8")
_ACTIVATION_QUANTIZATIONS = ("none", "fp8", "fp8-group")


def default_block_size(kv_cache_dtype: str) -> int:
    """Tokens a page when block_size is left unset: 32 over an FP8 cache, else 16."""
    return 32 if kv_cache_dtype == "fp8" else 16


@dataclass(frozen=True)
class EngineConfig:
    """How one engine (one device) runs. Every field is checked at construction."""

    model: str = ""
    """A local transformers causal-LM folder (config.json, weights, tokenizer), or "smollm2" for
    the built-in SmolLM2-135M-Instruct; empty when wrapping an in-memory model."""
    load_format: str = "auto"
    """"auto": the model folder's weights; "dummy": random weights from its config.json alone
    (benchmarks and drills: no checkpoint needed, shapes and speed are real)."""
    dtype: str = "auto"
    """Weights and KV cache dtype: "auto" = bfloat16 on CUDA, float32 on CPU."""
    device: str = "auto"
    """"auto" = CUDA when available, else CPU."""
    max_model_len: int = 4096
    """Longest sequence (prompt + completion) in tokens; generation stops there with reason "length"."""
    max_num_seqs: int = 256
    """Most sequences in one step (decode batch size cap)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step: decode tokens first, then chunks of prefills."""
    block_size: int | None = None
    """Tokens per KV-cache block (a page); None: 32 with kv_cache_dtype="fp8", else 16. An FP8
    cache's crowded decode reads each 32-token tile from one page, whole 4 KB runs of a KV
    head's keys and values: 11-17% faster from 8 running sequences, 15% at one long context,
    on one H100, where a bf16 cache reads the same at either size; pages of 64 and 128 ran grpo
    no faster (docs/performance.md, 'FP8 KV: pages of 32 tokens', '... of 64 and 128 in grpo')."""
    num_kv_blocks: int | None = None
    """KV-cache blocks; None = size from free memory (CUDA) or from max_num_seqs x max_model_len (CPU)."""
    gpu_memory_utilization: float = 0.9
    """Share of the GPU's total memory this engine may use (weights + activations + KV cache)."""
    overlap: bool = True
    """Overlap loop (CPU prepares step N+1 while the device runs step N); False = the sync loop."""
    cuda_graphs: bool = True
    """Capture decode and speculative verification steps in CUDA graphs (CUDA only; ignored on
    CPU)."""
    compile_model: bool = True
    """Fuse the decoder layers' small ops (norms, rotary, activation, residuals) with
    torch.compile (CUDA only; our attention stays outside the compiled code). Adds startup time."""
    fuse_projections: bool = True
    """Run q/k/v and gate/up as one GEMM each (parameter names kept, as views of the fused
    weight) for the Llama, Mistral and Qwen2/3 families, and q/k/v for Mixtral and Qwen3-MoE;
    other models run unchanged."""
    triton_linear: bool = True
    """On CUDA (bf16/fp16), run the output, down and LM-head projections with our Triton GEMM
    when a step has at most 64 rows (decode); cuBLAS otherwise. Faster than cuBLAS for those
    shapes at decode's few rows (benchmarks/bench_gemm.py times both); set False to compare."""
    fused_qk_rope: bool = True
    """Run a Qwen3-family attention's q/k norms and rotary embedding as one launch a layer
    (`rollout::qk_norm_rope`: a Triton kernel on CUDA), where the model's own modules compute
    the op's reference values (checked at load); with the same roundings as transformers'. Needs
    `fuse_projections`; set False to compare."""
    fused_moe: bool = True
    """On CUDA, run MoE experts (transformers' 3-D expert weights, SiLU-gated, no biases: Qwen2/3-MoE,
    Mixtral, OLMoE, ...) with our fused Triton kernel, which reads each touched expert once per
    step; other MoE models keep transformers' experts path. Set False to compare."""
    fused_routing: bool = True
    """On CUDA, run the softmax routers of Qwen2/3-MoE, OLMoE and Mixtral (softmax, top-k,
    renormalization, cast) as one Triton launch a layer instead of PyTorch's four to six; the
    router's logits GEMM and its weight stay its own. Other routers keep their code. Set False
    to compare."""
    attention: str = "auto"
    """Paged attention backend: "triton" on CUDA, "torch" (the reference twin) elsewhere."""
    enable_prefix_caching: bool = True
    """Keep the KV of full blocks after their request ends and reuse it for a later request
    that starts with the same tokens (a conversation's next turn, a shared system prompt): only
    the rest is computed. Exact (blocks match by a digest of every token before them). The
    engine's weight sync empties the cache; change the weights any other way and call
    `LLMEngine.reset_prefix_cache()`."""
    speculative: str = "none"
    """"ngram": speculative decoding with drafts from n-grams of the sample's prompt, its own
    output and its group's other samples. Exact: the emitted tokens and logprobs are those the
    plain sampler draws (the same seeds give the same tokens); it changes how many tokens a
    forward yields. Pays off in the tail, when few sequences run."""
    num_speculative_tokens: int = 4
    """Most draft tokens verified per sequence and step (the length adapts to acceptance)."""
    speculative_max_seqs: int = 8
    """Speculate only while at most this many sequences run: with more, a step is bound by the
    KV it reads rather than by the weights, and drafts no longer come nearly free. These steps
    run as the sync loop (the next step's inputs depend on the tokens accepted)."""
    record_routes: bool = False
    """Record the experts every fed token was routed to in each MoE layer and return them with
    each result (`Completion.routes`), so a trainer can replay them. MoE models with softmax
    top-k routers (Qwen2/3-MoE, OLMoE, Mixtral) only; needs enable_prefix_caching=False (a
    cached prefix's routes are not kept)."""
    weight_quantization: str = "none"
    """"fp8": the decoder layers' linear and MoE-expert weights rounded to e4m3 (a power-of-two
    scale per output row) and read as FP8 by the decode GEMMs, which halves a decode step's
    weight read. The engine then serves the rounded model exactly (prefill runs cuBLAS over the
    same rounded values); embeddings, norms, routers and the LM head stay as they are. Every
    weight update is rounded again on the device. Costs half the quantized weights' bytes more
    memory (the bf16 values stay, for prefill and weight sync). A trainer should correct for the
    rounding (the GRPO job turns its off-policy correction on)."""
    fp8_keep_unrounded: bool = False
    """With weight_quantization="fp8": keep each quantized weight's values before rounding in
    host memory (their bytes again, pinned), refreshed by every full weight sync, so that a LoRA
    adapter merges into the exact base and is rounded once. Without it an adapter sync is
    refused: merged into the rounded base, every update smaller than half an e4m3 step (most of
    a LoRA's) would vanish in the second rounding. The GRPO job turns it on for LoRA."""
    fp8_lm_head: bool = False
    """With weight_quantization="fp8": the LM head rounded and read as FP8 too where that pays
    (up to 32 rows; a head tied to the input embeddings is refused). At a few running sequences
    it is a tenth of a decode step's read (158 against 290 us on the Qwen3-8B shape); its drift to
    bf16 was not measurable beside the weights' (docs/performance.md)."""
    fp8_lm_head_input: bool = False
    """With fp8_lm_head and activation_quantization: the LM head rounds its input too (a row's
    scales as the layers' projections' are), so that its GEMM at up to 128 rows reads both
    operands as FP8, where from 33 rows the bf16 input leaves the head to cuBLAS over the bf16
    weight (Qwen3-8B shape, one H100: 0.22-0.23 ms against 0.43-0.44 at 64-128 rows; grpo on
    one H200: 0.7% faster, docs/performance.md). Its drift adds to the layers' (the logits'
    inputs are rounded), too little to see beside theirs on the Qwen3-8B shape:
    `bench_mismatch.py --fp8-lm-head-input` measures it."""
    activation_quantization: str = "none"
    """"fp8", with weight_quantization="fp8": every quantized projection of the decoder layers
    rounds its input too, each row to e4m3 with a power-of-two scale of its own, at every batch
    size and in prefill, so the decode GEMMs at up to 128 rows read both operands as stored
    (`triton_w8a8_linear`: 0.72-0.74x of bf16's GEMMs a layer at 32-64 rows, 0.9x at 96-128,
    where FP8 weights alone gain nothing; 2-10% faster than FP8 weights alone for the narrow
    projections at 1-16 rows). In Llama-family layers the norms round q/k/v's and gate/up's
    inputs in their own kernel, and a SiLU MLP's activation down's (rounded_layers.py). On the
    Qwen3-8B shape's grpo workload, with FP8 weights, KV cache and LM head (and its input): 1.33x
    of bf16 on one H200, 1.63x on one H100, at twice the drift to bf16 of FP8 weights alone
    (docs/performance.md). Dense models only (MoE experts are refused); the LM head's input is
    rounded only with fp8_lm_head_input. "fp8-group": the same
    with a scale per 128 consecutive inputs of a row (the 1 x 128 tiles of the FP8 training
    recipes), so an outlier coarsens only its own group; 2% slower on that workload (the FP8
    MMA scales each 128 of K's products apart)."""
    kv_cache_dtype: str = "auto"
    """"auto": the model's dtype; "fp8": keys and values stored as e4m3 with a power-of-two scale
    per token and KV head, written by the attention's KV write and widened by its reads, so the
    same memory holds 1.9x the tokens (head_dim 128) and a decode step reads about half the KV
    bytes (in 0.5-0.6x bf16's time from 8 sequences on one H100, in its default pages of 32
    tokens: docs/performance.md).
    The engine serves exactly the model whose attention sees those rounded keys and values (a
    trainer should correct for it, as for FP8 weights)."""
    seed: int = 0
    """Seeds the sampler for requests that bring no seed of their own."""
    cpu_kv_cache_gib: float = 2.0
    """Upper bound on the KV cache on CPU when num_kv_blocks is None."""

    @property
    def max_sampled_rows(self) -> int:
        """Most tokens one step samples: one per sequence, plus each verified draft."""
        if self.speculative == "none":
            return self.max_num_seqs
        return self.max_num_seqs + self.speculative_max_seqs * self.num_speculative_tokens

    def __post_init__(self) -> None:
        if self.block_size is None:  # frozen: set once, here
            object.__setattr__(self, "block_size", default_block_size(self.kv_cache_dtype))
        _check_choice("dtype", self.dtype, _DTYPES)
        _check_choice("device", self.device, _DEVICES)
        _check_choice("attention", self.attention, _ATTENTION_BACKENDS)
        _check_choice("load_format", self.load_format, _LOAD_FORMATS)
        _check_choice("speculative", self.speculative, _SPECULATIVE)
        _check_choice("weight_quantization", self.weight_quantization, _WEIGHT_QUANTIZATIONS)
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, _KV_CACHE_DTYPES)
        _check_choice(
            "activation_quantization", self.activation_quantization, _ACTIVATION_QUANTIZATIONS
        )
        for name, on in (
            ("fp8_lm_head", self.fp8_lm_head),
            (
                f"activation_quantization={self.activation_quantization!r}",
                self.activation_quantization != "none",
            ),
        ):
            if on and self.weight_quantization != "fp8":
                raise ValueError(f"{name} extends FP8 weights: it needs weight_quantization='fp8'")
        if self.fp8_lm_head_input and not (
            self.fp8_lm_head and self.activation_quantization != "none"
        ):
            raise ValueError(
                "fp8_lm_head_input rounds the FP8 LM head's input as activation_quantization "
                "rounds the layers' projections': it needs fp8_lm_head=True and "
                "activation_quantization='fp8' or 'fp8-group'"
            )
        if self.fp8_keep_unrounded and self.weight_quantization != "fp8":
            raise ValueError(
                "fp8_keep_unrounded keeps FP8 weights' unrounded values: it needs "
                "weight_quantization='fp8'"
            )
        for name in ("num_speculative_tokens", "speculative_max_seqs"):
            _check_positive_int(name, getattr(self, name))
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            _check_positive_int(name, getattr(self, name))
        if self.num_kv_blocks is not None:
            _check_positive_int("num_kv_blocks", self.num_kv_blocks)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1]; got {self.gpu_memory_utilization}"
            )
        if self.cpu_kv_cache_gib <= 0:
            raise ValueError(f"cpu_kv_cache_gib must be > 0; got {self.cpu_kv_cache_gib}")
        if self.record_routes and self.enable_prefix_caching:
            raise ValueError(
                "record_routes needs enable_prefix_caching=False: a prefix taken from the cache "
                "was computed for another request, and its routes are not kept"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an int; got {self.seed!r}")

    @classmethod
    def from_dict(cls, values: dict) -> EngineConfig:
        """Build from a plain dict (parsed YAML); unknown keys are errors that name the key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown engine config key(s) {unknown}; valid keys: {sorted(known)}")
        return cls(**values)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}")


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
