"""Who held a replica (the occupancy gauges themselves are in ``metrics``), one replica against
its pool, and the GPU faults DCGM reports."""

from __future__ import annotations

from typing import Final

# The tenant label of a request whose tenant is not one the config names (or none): the
# label stays bounded by the config's ``tenants:``.
OTHER_TENANT: Final = "-"

# One replica against its pool (alerts/replica_rules.py).
ALERT_REPLICA_OUTLIER: Final = "VllmObsReplicaOutlier"

# GPU faults dcgm-exporter reports (etc/default-counters.csv; the violation and ECC counters
# are commented out there and must be enabled).
DCGM_XID_ERRORS: Final = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the last XID error's number
DCGM_ECC_DBE_VOL: Final = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # counter: double-bit ECC errors
DCGM_UNCORRECTABLE_ROWS: Final = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"  # counter
DCGM_ROW_REMAP_FAILURE: Final = "DCGM_FI_DEV_ROW_REMAP_FAILURE"  # gauge: 1 when it failed
DCGM_THERMAL_VIOLATION: Final = "DCGM_FI_DEV_THERMAL_VIOLATION"  # counter: ns throttled
DCGM_POWER_VIOLATION: Final = "DCGM_FI_DEV_POWER_VIOLATION"  # counter: ns throttled
DCGM_FAULT_METRICS: Final = (
    DCGM_XID_ERRORS,
    DCGM_ECC_DBE_VOL,
    DCGM_UNCORRECTABLE_ROWS,
    DCGM_ROW_REMAP_FAILURE,
    DCGM_THERMAL_VIOLATION,
    DCGM_POWER_VIOLATION,
)
ALERT_GPU_XID: Final = "VllmObsGPUXidError"
ALERT_GPU_ECC: Final = "VllmObsGPUMemoryErrors"
ALERT_GPU_THROTTLED: Final = "VllmObsGPUThrottled"
GPU_FAULT_ALERTS: Final = (ALERT_GPU_XID, ALERT_GPU_ECC, ALERT_GPU_THROTTLED)
# Every alert of alerts/replica_rules.py and alerts/gpu_fault_rules.py (part of ALL_ALERTS).
REPLICA_ALERTS: Final = (ALERT_REPLICA_OUTLIER, *GPU_FAULT_ALERTS)
