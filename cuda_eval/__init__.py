"""cuda_eval: the evaluator (= the reward function) for model-written CUDA kernels.

Importing this package is cheap and never imports torch: the trainer process runs JAX, torch lives in the
sandboxed compile and GPU worker processes. The public door is `cuda_eval.api`; the layers below it are described in
docs/ARCHITECTURE.md ("cuda_eval internals").
"""
