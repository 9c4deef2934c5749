"""The model layer: transformers' own causal-LM classes, made to run on the paged KV cache.

loader.py                 AutoModelForCausalLM / AutoTokenizer, device, dtype, end-of-sample ids
capabilities.py           what the engine serves exactly; everything else refused at construction
attention_checks.py       what each layer asks the attention function for, checked per call
preparation.py            the model made ready once (the pieces below); a step's switch to them
attention.py              our paged attention, registered in transformers' AttentionInterface
forward_context.py        the per-step metadata that attention function reads
fused_projections.py      q/k/v and gate/up as one GEMM each (parameter names kept)
fused_qk_rope.py          Qwen3's q/k norms and rotary as one op, where the modules compute it
fp8_weights.py            FP8 weights: rounded in place, FP8 copies for the decode GEMMs
fused_experts.py          our fused MoE kernel, in transformers' experts interface
fused_routing.py          the softmax routers of known MoE classes as one Triton launch
implementation_switch.py  our implementations selected in the config for a step only
compilation.py            torch.compile of the decoder layers, our attention left outside
"""
