"""A simulated vLLM replica: vLLM's API and metrics over a modelled GPU (docs/sim.md).

``hardware`` times one engine step (a roofline of a named GPU and model),
``kvcache`` and ``scheduler`` are vLLM V1's block cache and step loop (pure, so a
virtual-time replay can drive them too), ``engine`` runs them in real time,
``api``/``server`` speak vLLM's OpenAI routes and ``/metrics``, ``cli`` is
``vllm-obs engine sim``.
"""
