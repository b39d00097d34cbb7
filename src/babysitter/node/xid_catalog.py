"""NVIDIA's Xid catalog: what each Xid code means and which action bucket it falls in.

Sources (read 2026): NVIDIA's Ampere+ Xid catalog, "Resolution Bucket (Immediate Action)" column
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), as NVIDIA ships it in machine
form in NVIDIA/NVSentinel ``distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv``
(code, mnemonic, bucket, FATAL|NONFATAL); ECC/row-remap semantics from
https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/. Short meanings are ours, for the codes seen on
training clusters; the others show NVIDIA's mnemonic.

NVIDIA's buckets are folded into six actions an operator (or a remediation controller) can take:

``ignore``       informational, nothing to do (NVIDIA IGNORE).
``restart_app``  the application died or must restart; the GPU is fine (RESTART_APP).
``reset_gpu``    the GPU needs a reset (``nvidia-smi -r``) before it is used again (RESET_GPU).
``reboot``       the node needs a reboot (RESTART_BM, RESTART_VM), e.g. Xid 79, fallen off the bus.
``drain``        take the node out of scheduling and have a human look (UNEXPECTED_ERR_REPORT_ISSUE /
                 CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW, CHECK_UVM).
``workflow``     NVIDIA prescribes a multi-step workflow that depends on more data (WORKFLOW_XID_45,
                 WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR, Xid 154's linked Xid).

A code missing from the catalog (a newer driver) gets action ``unknown``: counted, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ACTIONS", "CATALOG", "UNKNOWN_ACTION", "XidInfo", "action_for", "lookup"]

ACTIONS: Final = ("ignore", "restart_app", "reset_gpu", "reboot", "drain", "workflow")
UNKNOWN_ACTION: Final = "unknown"

_BUCKET_TO_ACTION: Final = {
    "IGNORE": "ignore",
    "RESTART_APP": "restart_app",
    "RESET_GPU": "reset_gpu",
    "RESTART_BM": "reboot",
    "RESTART_VM": "reboot",
    "UNEXPECTED_ERR_REPORT_ISSUE": "drain",
    "CONTACT_SUPPORT": "drain",
    "CHECK_MECHANICALS": "drain",
    "UPDATE_SWFW": "drain",
    "CHECK_UVM": "drain",
    "WORKFLOW_XID_45": "workflow",
    "WORKFLOW_XID_48": "workflow",
    "WORKFLOW_NVLINK_ERR": "workflow",
    "WORKFLOW_NVLINK5_ERR": "workflow",
    "XID_154": "workflow",
}


@dataclass(frozen=True)
class XidInfo:
    """One catalog row: NVIDIA's mnemonic and bucket, whether NVIDIA calls it fatal, and our action."""

    code: int
    mnemonic: str
    nvidia_bucket: str
    fatal: bool
    meaning: str
    action: str


# (code, mnemonic, NVIDIA immediate-action bucket, fatal, short meaning or "" for the mnemonic)
_ROWS: Final[tuple[tuple[int, str, str, bool, str], ...]] = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "RESTART_APP",
        False,
        "GPU stopped processing (FIFO idle timeout)",
    ),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP", False, ""),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "RESTART_APP",
        False,
        "graphics engine exception (often an application fault: illegal address, bad kernel)",
    ),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE", False, "fake error injected for testing"),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP", False, ""),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (27, "ROBUST_CHANNEL_VP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "RESTART_APP",
        False,
        "GPU memory page fault (MMU); usually an application bug, sometimes a driver or HW fault",
    ),
    (
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "RESTART_APP",
        False,
        "invalid or corrupted push buffer stream (PBDMA)",
    ),
    (33, "ROBUST_CHANNEL_SEC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE", False, ""),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", False, "FECS watchdog timeout"),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP", False, ""),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP", False, ""),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP", False, ""),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "IGNORE",
        False,
        "GPU stopped processing a channel (channel reset; the GPU itself is fine)",
    ),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE", False, ""),
    (
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "WORKFLOW_XID_45",
        False,
        "preemptive cleanup of channels after earlier errors",
    ),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", True, "GPU stopped responding (timeout)"),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", True, "double-bit (uncorrectable) ECC error"),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "CHECK_MECHANICALS",
        True,
        "power-reduced clocking (check power and cooling)",
    ),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (58, "FB_MEMORY_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (59, "PMU_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP", False, ""),
    (61, "PMU_BREAKPOINT", "UNEXPECTED_ERR_REPORT_ISSUE", True, "internal micro-controller (PMU) breakpoint"),
    (62, "PMU_HALT_ERROR", "RESET_GPU", True, "internal micro-controller (PMU) halt"),
    (
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "IGNORE",
        False,
        "row remap / page retirement recorded; reset the GPU to apply",
    ),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", True, "row remap / page retirement failed"),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE", False, ""),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE", False, ""),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP", False, "video decoder (NVDEC0) exception"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", False, "graphics engine class error"),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP", False, ""),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP", False, ""),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP", False, ""),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", True, "NVLink error"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP", False, ""),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP", False, ""),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP", False, ""),
    (78, "VGPU_START_ERROR", "UPDATE_SWFW", True, "vGPU start error"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", True, "GPU has fallen off the bus"),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP", False, ""),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP", False, ""),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP", False, ""),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP", False, ""),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP", False, ""),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP", False, ""),
    (87, "NVTELEMETRY_DRIVER_REPORT", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP", False, ""),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP", False, ""),
    (90, "LTC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (91, "RESERVED_XID", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", False, "high single-bit ECC error rate"),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE", False, ""),
    (
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "RESTART_APP",
        False,
        "contained ECC error: only the affected application dies",
    ),
    (
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "RESET_GPU",
        True,
        "uncontained ECC error: all applications on the GPU are affected",
    ),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP", False, ""),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP", False, ""),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP", False, ""),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP", False, ""),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP", False, ""),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP", False, ""),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP", False, ""),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP", False, ""),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP", False, ""),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP", False, ""),
    (106, "SMBPBI_TEST_MESSAGE", "IGNORE", False, ""),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE", False, ""),
    (108, "DESTINATION_FLA_TRANSLATION_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", True, "context-switch timeout"),
    (110, "SEC_FAULT_ERROR", "RESET_GPU", True, ""),
    (111, "BUNDLE_ERROR_EVENT", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (112, "DISP_SUPERVISOR_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (113, "DP_LT_FAILURE", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (114, "HEAD_RG_UNDERFLOW", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (115, "CORE_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (116, "WINDOW_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (117, "CURSOR_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (118, "HEAD_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (119, "GSP_RPC_TIMEOUT", "RESET_GPU", True, "GSP RPC timeout"),
    (120, "GSP_ERROR", "RESET_GPU", True, "GSP firmware error"),
    (121, "C2C_ERROR", "IGNORE", False, "C2C link error"),
    (122, "SPI_PMU_RPC_READ_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (125, "INFOROM_FS_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP", False, ""),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP", False, ""),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP", False, ""),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP", False, ""),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP", False, ""),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP", False, ""),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP", False, ""),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP", False, ""),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP", False, ""),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP", False, ""),
    (136, "ALI_TRAINING_FAIL", "RESET_GPU", True, "NVLink ALI training failure"),
    (137, "NVLINK_FLA_PRIV_ERR", "IGNORE", False, ""),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP", False, ""),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", True, "unrecovered ECC error escaped containment"),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE", False, ""),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True, ""),
    (143, "GPU_INIT_ERROR", "RESET_GPU", True, "GPU initialization failure"),
    (144, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", True, "NVLink5 SAW error"),
    (145, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", True, "NVLink5 RLW error"),
    (146, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", True, "NVLink5 TLW error"),
    (147, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", True, "NVLink5 TREX error"),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", True, "NVLink5 NVLPW control error"),
    (149, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", True, "NVLink5 NETIR error"),
    (150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", True, "NVLink5 MSE error"),
    (
        151,
        "ROBUST_CHANNEL_KEY_ROTATION_ERROR",
        "RESTART_VM",
        True,
        "key rotation error (confidential computing)",
    ),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE", False, ""),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE", False, ""),
    (
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "XID_154",
        False,
        "GPU recovery action changed: follow the linked Xid's guidance",
    ),
    (155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", True, "NVLink software-defined error"),
    (156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU", True, "resource retirement event"),
    (157, "RESOURCE_RETIREMENT_FAILURE", "IGNORE", False, "resource retirement failure"),
    (158, "GPU_FATAL_TIMEOUT", "RESET_GPU", True, "GPU fatal timeout"),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM", False, "CHI non-data error"),
    (160, "CHANNEL_RETIREMENT_EVENT", "RESTART_BM", True, "channel retirement event"),
    (161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE", False, "channel retirement failure"),
)


def _build() -> dict[int, XidInfo]:
    table: dict[int, XidInfo] = {}
    for code, mnemonic, bucket, fatal, meaning in _ROWS:
        table[code] = XidInfo(
            code=code,
            mnemonic=mnemonic,
            nvidia_bucket=bucket,
            fatal=fatal,
            meaning=meaning or mnemonic.lower().replace("_", " "),
            action=_BUCKET_TO_ACTION[bucket],
        )
    return table


CATALOG: Final[dict[int, XidInfo]] = _build()


def lookup(code: int) -> XidInfo | None:
    """The catalog row for ``code``; None for a code NVIDIA had not published when this was written."""
    return CATALOG.get(code)


def action_for(code: int) -> str:
    """The action bucket of ``code`` (one of :data:`ACTIONS`), or ``unknown``."""
    info = CATALOG.get(code)
    return info.action if info is not None else UNKNOWN_ACTION
