"""The model layer: transformers' own causal-LM classes, made to run on the paged KV cache.

loader.py             AutoModelForCausalLM / AutoTokenizer, device and dtype
attention.py          our paged attention, registered in transformers' AttentionInterface
forward_context.py    the per-step metadata that attention function reads
fused_projections.py  q/k/v and gate/up as one GEMM each (parameter names kept)
compilation.py        torch.compile of the decoder layers, our attention left outside
"""
