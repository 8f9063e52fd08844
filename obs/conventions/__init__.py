"""Every metric, label and bucket name the project exports or queries.

Exporters, dashboards and alert rules import names from here and nowhere
else; a test checks that every generated PromQL expression names only metrics
defined in this module (or vLLM's own, listed in ``VLLM_METRICS``).

The names live in submodules by kind (labels, metrics, engines, buckets, rules, spans, genai);
import them from here: ``from obs import conventions as c``. Every public name of a submodule
is a convention (a submodule keeps its helpers private with a leading ``_``), so adding a
name is writing it once, in its submodule.
"""

from __future__ import annotations

from obs.conventions.buckets import *  # noqa: F403
from obs.conventions.causes import *  # noqa: F403
from obs.conventions.engines import *  # noqa: F403
from obs.conventions.genai import *  # noqa: F403
from obs.conventions.labels import *  # noqa: F403
from obs.conventions.metrics import *  # noqa: F403
from obs.conventions.occupancy import *  # noqa: F403
from obs.conventions.rules import *  # noqa: F403
from obs.conventions.spans import *  # noqa: F403
