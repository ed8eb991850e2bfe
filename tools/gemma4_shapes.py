"""gemma4_shapes.py - the real Gemma 4 E2B / E4B text-decoder shapes as a transformers config (shared by
bench/e2e/e2e_bench.py and tools/shape_checkpoint.py)."""
from transformers import Gemma4TextConfig

SHAPES = {
    "e2b": dict(hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8, num_key_value_heads=1,
                head_dim=256, global_head_dim=512, num_kv_shared_layers=20, use_double_wide_mlp=True,
                layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7),
    "e4b": dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=42, num_attention_heads=8, num_key_value_heads=2,
                head_dim=256, global_head_dim=512, num_kv_shared_layers=18, use_double_wide_mlp=False,
                layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 7),
}


def text_config(model):
    return Gemma4TextConfig(vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256, sliding_window=512,
                            final_logit_softcapping=30.0, max_position_embeddings=131072, **SHAPES[model])
