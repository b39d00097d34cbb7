"""NVIDIA's Xid catalog: what each Xid code means and which action bucket it falls in.

Sources (read 2026): NVIDIA's Ampere+ Xid catalog, "Resolution Bucket (Immediate Action)" column, codes
1-172 (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html); the FATAL/NONFATAL flag
from the machine-readable copy NVIDIA ships in NVIDIA/NVSentinel
``distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv`` (codes 1-162). Where
the two disagree the catalog page wins: 108 (IGNORE, the CSV says UNEXPECTED_ERR_REPORT_ISSUE) and 160
(IGNORE, the CSV says RESTART_BM). ECC/row-remap semantics from
https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/. Short meanings are ours, for the codes seen on
training clusters; the others show NVIDIA's mnemonic. The driver (open-gpu-kernel-modules 595.45.04,
``src/common/sdk/nvidia/inc/nverror.h``) already defines 173-176, which the catalog does not list yet:
they count as ``unknown``.

NVIDIA's buckets are folded into six actions an operator (or a remediation controller) can take:

``ignore``       informational, nothing to do (NVIDIA IGNORE).
``restart_app``  the application died or must restart; the GPU is fine (RESTART_APP).
``reset_gpu``    the GPU needs a reset (``nvidia-smi -r``) before it is used again (RESET_GPU).
``reboot``       the node needs a reboot (RESTART_BM, RESTART_VM), e.g. Xid 79, fallen off the bus.
``drain``        take the node out of scheduling and have a human look (CONTACT_SUPPORT, formerly
                 UNEXPECTED_ERR_REPORT_ISSUE; CHECK_MECHANICALS, UPDATE_SWFW, CHECK_UVM).
``workflow``     NVIDIA prescribes a multi-step workflow that depends on more data (WORKFLOW_XID_45,
                 WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR, Xid 154's linked Xid).

NVIDIA lists 162-172 without a bucket; their action is ours, from the catalog's text (``_OUR_ACTIONS``).
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
    """One catalog row: NVIDIA's mnemonic and bucket, whether it is fatal, and our action.

    ``nvidia_bucket`` is "" for codes NVIDIA lists without one (162-172); their ``action`` is ours and
    ``fatal`` says whether that action takes the GPU out of service. Elsewhere ``fatal`` is NVIDIA's
    FATAL/NONFATAL flag from the NVSentinel CSV.
    """

    code: int
    mnemonic: str
    nvidia_bucket: str
    fatal: bool
    meaning: str
    action: str


# (code, mnemonic, NVIDIA immediate-action bucket, fatal, short meaning or "" for the mnemonic)
_ROWS: Final[tuple[tuple[int, str, str, bool, str], ...]] = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "CONTACT_SUPPORT", True, ""),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "CONTACT_SUPPORT", True, ""),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "CONTACT_SUPPORT", True, ""),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "CONTACT_SUPPORT", True, ""),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "CONTACT_SUPPORT", True, ""),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "CONTACT_SUPPORT", True, ""),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "CONTACT_SUPPORT", True, ""),
    (
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "RESTART_APP",
        False,
        "GPU stopped processing (FIFO idle timeout)",
    ),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "CONTACT_SUPPORT", True, ""),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "CONTACT_SUPPORT", True, ""),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP", False, ""),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "CONTACT_SUPPORT", True, ""),
    (
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "RESTART_APP",
        False,
        "graphics engine exception (often an application fault: illegal address, bad kernel)",
    ),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE", False, "fake error injected for testing"),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "CONTACT_SUPPORT", True, ""),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "CONTACT_SUPPORT", True, ""),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "CONTACT_SUPPORT", True, ""),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "CONTACT_SUPPORT", True, ""),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "CONTACT_SUPPORT", True, ""),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "CONTACT_SUPPORT", True, ""),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "CONTACT_SUPPORT", True, ""),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "CONTACT_SUPPORT", True, ""),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "CONTACT_SUPPORT", True, ""),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "CONTACT_SUPPORT", True, ""),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP", False, ""),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "CONTACT_SUPPORT", True, ""),
    (27, "ROBUST_CHANNEL_VP_ERROR", "CONTACT_SUPPORT", True, ""),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "CONTACT_SUPPORT", True, ""),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "CONTACT_SUPPORT", True, ""),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "CONTACT_SUPPORT", True, ""),
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
    (33, "ROBUST_CHANNEL_SEC_ERROR", "CONTACT_SUPPORT", True, ""),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "CONTACT_SUPPORT", True, ""),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "CONTACT_SUPPORT", True, ""),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "CONTACT_SUPPORT", True, ""),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE", False, ""),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", False, "FECS watchdog timeout"),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP", False, ""),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP", False, ""),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP", False, ""),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "CONTACT_SUPPORT", True, ""),
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
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "CONTACT_SUPPORT", True, ""),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", True, "double-bit (uncorrectable) ECC error"),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "CONTACT_SUPPORT", True, ""),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "CONTACT_SUPPORT", True, ""),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "CONTACT_SUPPORT", True, ""),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "CONTACT_SUPPORT", True, ""),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "CONTACT_SUPPORT", True, ""),
    (
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "CHECK_MECHANICALS",
        True,
        "power-reduced clocking (check power and cooling)",
    ),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "CONTACT_SUPPORT", True, ""),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "CONTACT_SUPPORT", True, ""),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "CONTACT_SUPPORT", True, ""),
    (58, "FB_MEMORY_ERROR", "CONTACT_SUPPORT", True, ""),
    (59, "PMU_ERROR", "CONTACT_SUPPORT", True, ""),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP", False, ""),
    (61, "PMU_BREAKPOINT", "CONTACT_SUPPORT", True, "internal micro-controller (PMU) breakpoint"),
    (62, "PMU_HALT_ERROR", "RESET_GPU", True, "internal micro-controller (PMU) halt"),
    (
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "IGNORE",
        False,
        "row remap / page retirement recorded; reset the GPU to apply",
    ),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", True, "row remap / page retirement failed"),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "CONTACT_SUPPORT", True, ""),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE", False, ""),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE", False, ""),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP", False, "video decoder (NVDEC0) exception"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", False, "graphics engine class error"),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP", False, ""),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP", False, ""),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP", False, ""),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "CONTACT_SUPPORT", True, ""),
    (74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", True, "NVLink error"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP", False, ""),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP", False, ""),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP", False, ""),
    (78, "VGPU_START_ERROR", "UPDATE_SWFW", True, "vGPU start error"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", True, "GPU has fallen off the bus"),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP", False, ""),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "CONTACT_SUPPORT", True, ""),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP", False, ""),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP", False, ""),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP", False, ""),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP", False, ""),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP", False, ""),
    (87, "NVTELEMETRY_DRIVER_REPORT", "CONTACT_SUPPORT", True, ""),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP", False, ""),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP", False, ""),
    (90, "LTC_ERROR", "CONTACT_SUPPORT", True, ""),
    (91, "RESERVED_XID", "CONTACT_SUPPORT", True, ""),
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
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "IGNORE", True, ""),  # FATAL per the CSV
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", True, "context-switch timeout"),
    (110, "SEC_FAULT_ERROR", "RESET_GPU", True, ""),
    (111, "BUNDLE_ERROR_EVENT", "CONTACT_SUPPORT", True, ""),
    (112, "DISP_SUPERVISOR_ERROR", "CONTACT_SUPPORT", True, ""),
    (113, "DP_LT_FAILURE", "CONTACT_SUPPORT", True, ""),
    (114, "HEAD_RG_UNDERFLOW", "CONTACT_SUPPORT", True, ""),
    (115, "CORE_CHANNEL_REGS", "CONTACT_SUPPORT", True, ""),
    (116, "WINDOW_CHANNEL_REGS", "CONTACT_SUPPORT", True, ""),
    (117, "CURSOR_CHANNEL_REGS", "CONTACT_SUPPORT", True, ""),
    (118, "HEAD_REGS", "CONTACT_SUPPORT", True, ""),
    (119, "GSP_RPC_TIMEOUT", "RESET_GPU", True, "GSP RPC timeout"),
    (120, "GSP_ERROR", "RESET_GPU", True, "GSP firmware error"),
    (121, "C2C_ERROR", "IGNORE", False, "C2C link error"),
    (122, "SPI_PMU_RPC_READ_FAIL", "CONTACT_SUPPORT", True, ""),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "CONTACT_SUPPORT", True, ""),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "CONTACT_SUPPORT", True, ""),
    (125, "INFOROM_FS_ERROR", "CONTACT_SUPPORT", True, ""),
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
    (137, "NVLINK_PRIV_ERR", "IGNORE", False, "NVLink privilege error (illegal peer-to-peer access)"),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "CONTACT_SUPPORT", True, ""),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP", False, ""),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", True, "unrecovered ECC error escaped containment"),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE", False, ""),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT", True, ""),
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
    (160, "CHANNEL_RETIREMENT_EVENT", "IGNORE", True, "channel retirement event"),  # FATAL per the CSV
    (161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE", False, "channel retirement failure"),
    # 162-172: NVIDIA lists them with no resolution bucket; the action is ours (_OUR_ACTIONS, and why).
    (162, "PSHC_REENGAGED", "", False, "power smoothing circuitry re-engaged"),
    (163, "PSHC_DISENGAGED", "", False, "power smoothing circuitry disengaged (thermal events or a timeout)"),
    (164, "PSHC_LOW_LIFETIME", "", False, "power smoothing circuitry near the end of its lifetime"),
    (165, "PSHC_ZERO_LIFETIME", "", False, "power smoothing circuitry lifetime exhausted: power swings"),
    (166, "NVLINK_SECURE_CRYPTO_ERR", "", True, "confidential computing: NVLink traffic before encryption"),
    (167, "PCIE_FATAL_TIMEOUT", "", True, "fatal PCIe timeout"),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "", True, "errors in the write-protected region: less GPU memory"),
    (169, "SEC2_HALT_ERROR", "", True, "internal micro-controller (SEC2) halt"),
    (170, "NVLINK_SECURE_OTHER", "", True, "confidential computing: unexpected NVLink interrupt"),
    (171, "UNCORRECTABLE_DRAM_ERROR", "", True, "uncorrectable DRAM error (details of an Xid 48)"),
    (172, "UNCORRECTABLE_SRAM_ERROR", "", True, "uncorrectable SRAM error (details of an Xid 48)"),
)

#: Our action for the codes NVIDIA's catalog lists without a resolution bucket, from its text and its
#: nearest bucketed sibling (see docs/xid.md, "Codes without an NVIDIA bucket").
_OUR_ACTIONS: Final[dict[int, str]] = {
    162: "ignore",  # a capability came back: nothing to do
    163: "workflow",  # "No GPU reset required"; resolve the thermal events, or reload the driver / reset
    164: "workflow",  # "Monitor power swings and expect to replace GPUs if power smoothing is desired"
    165: "workflow",  # power smoothing is off: decide whether the data center absorbs the power swings
    166: "drain",  # an unexpected security event in CC mode: a human looks (as CONTACT_SUPPORT)
    167: "reset_gpu",  # a fatal timeout, as 158 GPU_FATAL_TIMEOUT (RESET_GPU)
    168: "drain",  # "enable ECC, or re-attempt the boot with a shifted WPR": a human decides
    169: "reset_gpu",  # micro-controller halt, as 62 PMU_HALT_ERROR (RESET_GPU)
    170: "drain",  # as 166
    171: "workflow",  # "additional to Xid 48": Xid 48's workflow (WORKFLOW_XID_48)
    172: "workflow",  # as 171
}


def _build() -> dict[int, XidInfo]:
    table: dict[int, XidInfo] = {}
    for code, mnemonic, bucket, fatal, meaning in _ROWS:
        table[code] = XidInfo(
            code=code,
            mnemonic=mnemonic,
            nvidia_bucket=bucket,
            fatal=fatal,
            meaning=meaning or mnemonic.lower().replace("_", " "),
            action=_BUCKET_TO_ACTION[bucket] if bucket else _OUR_ACTIONS[code],
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
