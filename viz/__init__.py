"""minillm.viz: plots and widgets for the notebooks (matplotlib + ipywidgets).

viz draws the plain data that minillm records or measures (Trace steps, minillm.bench.profiling results,
tensors); it never reaches into the engine's internals, and minillm never imports it.
One concept per file: engine_path, trace, sampling, architecture, forward_breakdown, attention,
rope, kv_cache, decode_timing, decoding, training, serving, scheduling, kernels, flash, quant, spec, medusa_tree,
moe_lora, parallel, capstone, source (diagram and _figure are the shared drawing kit).
"""
from .architecture import draw_llama_block, llama_steps
from .attention import plot_attention
from .capstone import plot_capstone_trace, plot_waterfall
from .decode_timing import plot_decode_timing, plot_prefill_vs_decode
from .decoding import draw_beam_tree, draw_dfa, plot_mask_cost, plot_masks_per_step, plot_strategies
from .engine_path import draw_engine_map, draw_engine_path
from .flash import draw_attention_tiles, plot_attention_memory, plot_online_softmax, plot_split_sweep
from .forward_breakdown import plot_forward_breakdown
from .kernels import plot_access_diagram, plot_fusion, plot_roofline
from .kv_cache import draw_kv_pool, draw_recompute_grid, plot_kv_bytes, plot_kv_bytes_vs_length
from .moe_lora import draw_moe_and_lora, plot_adapter_costs, plot_expert_routing, plot_tokens_per_expert
from .parallel import (
                      draw_tp_split,
                      plot_bubble,
                      plot_disagg_timelines,
                      plot_disagg_tradeoff,
                      plot_link_times,
                      plot_rank_timeline,
                      plot_router_comparison,
                      time_shares,
)
from .quant import plot_channel_error_heatmap, plot_pareto, plot_speedup_vs_batch, plot_weight_activation_hist
from .rope import plot_rope
from .sampling import plot_next_token_distribution, sampling_explorer
from .scheduling import (
                      draw_prefix_caches,
                      plot_client_service,
                      plot_latency_vs_utilisation,
                      plot_order_comparison,
                      plot_request_timelines,
)
from .serving import (
                      plot_block_map,
                      plot_block_size_sweep,
                      plot_latency_vs_throughput,
                      plot_memory_bars,
                      plot_serve_comparison,
                      plot_timeline,
                      serving_explorer,
)
from .source import show_source
from .spec import (
                      draw_medusa_tree,
                      plot_acceptance_bars,
                      plot_exactness,
                      plot_pass_cost,
                      plot_spec_vs_batch,
                      plot_spec_vs_gamma,
                      spec_counts,
                      spec_text_html,
)
from .trace import plot_trace
from .training import plot_expected_tokens, plot_training_curves

__all__ = ["draw_engine_path", "draw_engine_map", "plot_capstone_trace", "plot_waterfall",
           "plot_trace", "plot_next_token_distribution", "sampling_explorer",
           "draw_llama_block", "llama_steps", "plot_forward_breakdown", "plot_attention", "plot_rope",
           "draw_recompute_grid", "plot_kv_bytes", "plot_kv_bytes_vs_length", "draw_kv_pool",
           "plot_decode_timing", "plot_prefill_vs_decode", "plot_training_curves", "plot_expected_tokens",
           "plot_timeline", "plot_block_map",
           "plot_memory_bars", "plot_serve_comparison", "plot_latency_vs_throughput", "serving_explorer",
           "plot_block_size_sweep",
           "plot_access_diagram", "plot_roofline", "plot_fusion",
           "draw_attention_tiles", "plot_online_softmax", "plot_attention_memory", "plot_split_sweep",
           "plot_weight_activation_hist", "plot_channel_error_heatmap", "plot_pareto", "plot_speedup_vs_batch",
           "spec_text_html", "spec_counts", "plot_spec_vs_gamma", "plot_spec_vs_batch", "draw_medusa_tree",
           "plot_acceptance_bars",
           "plot_pass_cost", "plot_exactness", "show_source",
           "plot_request_timelines", "plot_order_comparison", "plot_client_service", "plot_latency_vs_utilisation",
           "draw_prefix_caches",
           "plot_strategies", "draw_beam_tree", "draw_dfa", "plot_masks_per_step", "plot_mask_cost",
           "draw_moe_and_lora", "plot_expert_routing", "plot_tokens_per_expert", "plot_adapter_costs",
           "draw_tp_split", "plot_rank_timeline", "time_shares", "plot_bubble", "plot_link_times",
           "plot_router_comparison", "plot_disagg_timelines", "plot_disagg_tradeoff"]
