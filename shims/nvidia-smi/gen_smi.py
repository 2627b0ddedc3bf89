#!/usr/bin/env python3
"""Generates shims/nvidia-smi/smi_gen.h from real output: the 590/595 captures (help texts, the
--query-gpu field table with names, aliases and units, per captured board the -q -x element
skeleton, the -q text skeletons of 590 and 595) and the records of NVIDIA's own nvidia-smi of
each Debian-shipped branch (tests/fixtures/nvidia-smi-branches, made by record_branches.py):
per branch its help texts, --query-gpu fields with their units and printed names, -q and -q -x
skeletons, -q colon column, DTD version and default-table frame. nvidia-smi.c fills the
skeletons with values from NVML. `--check` fails if the committed header is stale (CI runs it)."""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CAPTURES = ROOT / "tests" / "fixtures" / "captures"
OUT = HERE / "smi_gen.h"
TEXT_H100 = "nvidia-smi-text.h100-80gb-hbm3.590.48.01.txt"
TEXT_L40S = "nvidia-smi-text.l40s.595.80.txt"
XML_BOARDS = ["a100", "h100", "b200", "gb200", "gb300", "l40s", "t4"]
RECORDS = ROOT / "tests" / "fixtures" / "nvidia-smi-branches"
BRANCHES = [470, 525, 535, 550]  # the Debian-shipped branches recorded by record_branches.py

# Extra value keys (beyond the --query-gpu fields) used by -q and -q -x.
EXTRA_KEYS = [
    "x.product_brand", "x.product_architecture", "x.minor_number", "x.multigpu_board", "x.board_id",
    "x.board_part_number", "x.gpu_part_number", "x.gsp_firmware_version", "x.module_id", "x.bar1.total", "x.bar1.used",
    "x.bar1.free", "x.clocks.max.video", "x.clocks.max_boost.graphics", "x.numa", "x.power_state",
    "x.temp.shutdown", "x.temp.slowdown", "x.temp.max_gpu", "x.temp.max_mem", "x.temp.target",
    "x.temp.shutdown_tlimit", "x.temp.slowdown_tlimit", "x.temp.max_gpu_tlimit",
    "x.temp.max_mem_tlimit", "x.pcie.replay", "x.pcie.tx", "x.pcie.rx", "x.ecc.dram.corr.vol",
    "x.ecc.dram.unc.vol", "x.ecc.dram.corr.agg", "x.ecc.dram.unc.agg", "x.ecc.sram.corr.vol",
    "x.ecc.sram.corr.agg", "x.supported_mem_clock", "x.supported_graphics_clock",
    "x.cuda_version", "x.display_clock_setting",
    # values the captures have beyond --query-gpu's fields (the N/A count)
    "x.pdi", "x.virtualization_mode", "x.pcie.replay_rollover", "x.reset_required", "x.drain_and_reset",
    "x.fbc.sessions", "x.fbc.fps", "x.fbc.latency", "x.repair.channel", "x.repair.tpc", "x.egm",
    "x.module_power_state", "x.remap.corr_inactive", "x.remap.unc_inactive", "x.unrepairable",
]

# The same -q -x leaves of both tables below and their keys: what the captures print and NVML
# answers (tests/test_smi_na.py counts the N/A left).
_COUNTERS = {"sw_power_cap": "sw_power_cap", "sync_boost": "sync_boost", "sw_therm_slowdown": "sw_thermal_slowdown",
             "hw_therm_slowdown": "hw_thermal_slowdown", "hw_power_brake": "hw_power_brake_slowdown"}
_HISTOGRAM = ("max", "high", "partial", "low", "none")
_SRAM_SOURCES = {"l2": "l2", "sm": "sm", "microcontroller": "mcu", "pcie": "pcie", "other": "other"}
XML_VALUES = {
    "display_mode": "display_mode", "display_active": "display_active", "pdi": "x.pdi", "c2c_mode": "c2c.mode",
    "gpu_virtualization_mode/virtualization_mode": "x.virtualization_mode",
    "gpu_reset_status/reset_required": "x.reset_required",
    "gpu_reset_status/drain_and_reset_recommended": "x.drain_and_reset",
    "gpu_recovery_action": "gpu_recovery_action", "pci/replay_rollover_counter": "x.pcie.replay_rollover",
    **{f"clocks_event_reasons_counters/clocks_event_reasons_counters_{x}": f"clocks_event_reasons_counters.{k}"
       for x, k in _COUNTERS.items()},
    **{f"cc_protected_memory_usage/{x}": f"protected_memory.{x}" for x in ("total", "used", "free")},
    "utilization/jpeg_util": "utilization.jpeg", "utilization/ofa_util": "utilization.ofa",
    "encoder_stats/session_count": "encoder.stats.sessionCount", "encoder_stats/average_fps": "encoder.stats.averageFps",
    "encoder_stats/average_latency": "encoder.stats.averageLatency",
    "fbc_stats/session_count": "x.fbc.sessions", "fbc_stats/average_fps": "x.fbc.fps",
    "fbc_stats/average_latency": "x.fbc.latency",
    "ecc_errors/volatile/sram_uncorrectable": "ecc.errors.uncorrected.volatile.sram",
    "ecc_errors/aggregate/sram_uncorrectable": "ecc.errors.uncorrected.aggregate.sram",
    **{f"ecc_errors/{scope}/sram_uncorrectable_{x}": f"ecc.errors.uncorrected.{scope}.sram.{x}"
       for scope in ("volatile", "aggregate") for x in ("parity", "secded")},
    "ecc_errors/aggregate/sram_threshold_exceeded": "ecc.errors.uncorrected.aggregate.sram.thresholdExceeded",
    **{f"ecc_errors/aggregate_uncorrectable_sram_sources/sram_{x}": f"ecc.errors.uncorrected.aggregate.sram.{k}"
       for x, k in _SRAM_SOURCES.items()},
    "ecc_errors/channel_repair_pending": "x.repair.channel", "ecc_errors/tpc_repair_pending": "x.repair.tpc",
    **{f"remapped_rows/row_remapper_histogram/row_remapper_histogram_{x}": (f"remapped_rows.histogram.{x}", " bank(s)")
       for x in _HISTOGRAM},
    "retired_pages/pending_blacklist": "retired_pages.pending",
    "module_power_readings/power_state": "x.module_power_state",
    "edpp_multiplier": "edpp_multiplier", "capabilities/egm": "x.egm",
    "remapped_rows/remapped_row_corr_inactive": "x.remap.corr_inactive",
    "remapped_rows/remapped_row_unc_inactive": "x.remap.unc_inactive",
    "ecc_errors/unrepairable_memory": "x.unrepairable",
}
TEXT_VALUES = {
    "Display Mode": "display_mode", "Display Active": "display_active", "GPU PDI": "x.pdi", "GPU C2C Mode": "c2c.mode",
    "GPU Virtualization Mode/Virtualization Mode": "x.virtualization_mode",
    "GPU Reset Status/Reset Required": "x.reset_required",
    "GPU Reset Status/Drain and Reset Recommended": "x.drain_and_reset",
    "GPU Recovery Action": "gpu_recovery_action", "PCI/Replay Number Rollovers": "x.pcie.replay_rollover",
    **{f"Clocks Event Reasons Counters/{label}": f"clocks_event_reasons_counters.{k}"
       for label, k in (("SW Power Capping", "sw_power_cap"), ("Sync Boost", "sync_boost"),
                        ("SW Thermal Slowdown", "sw_thermal_slowdown"), ("HW Thermal Slowdown", "hw_thermal_slowdown"),
                        ("HW Power Braking", "hw_power_brake_slowdown"))},
    **{f"Conf Compute Protected Memory Usage/{x.title()}": f"protected_memory.{x}" for x in ("total", "used", "free")},
    "Utilization/JPEG": "utilization.jpeg", "Utilization/OFA": "utilization.ofa",
    "Encoder Stats/Active Sessions": "encoder.stats.sessionCount", "Encoder Stats/Average FPS": "encoder.stats.averageFps",
    "Encoder Stats/Average Latency": "encoder.stats.averageLatency",
    "FBC Stats/Active Sessions": "x.fbc.sessions", "FBC Stats/Average FPS": "x.fbc.fps",
    "FBC Stats/Average Latency": "x.fbc.latency",
    **{f"ECC Errors/{scope.title()}/SRAM Uncorrectable {label}": f"ecc.errors.uncorrected.{scope}.sram.{x}"
       for scope in ("volatile", "aggregate") for label, x in (("Parity", "parity"), ("SEC-DED", "secded"))},
    "ECC Errors/Aggregate/SRAM Threshold Exceeded": "ecc.errors.uncorrected.aggregate.sram.thresholdExceeded",
    **{f"ECC Errors/Aggregate Uncorrectable SRAM Sources/SRAM {label}": f"ecc.errors.uncorrected.aggregate.sram.{k}"
       for label, k in (("L2", "l2"), ("SM", "sm"), ("Microcontroller", "mcu"), ("PCIE", "pcie"), ("Other", "other"))},
    "ECC Errors/Channel Repair Pending": "x.repair.channel", "ECC Errors/TPC Repair Pending": "x.repair.tpc",
    **{f"Remapped Rows/Bank Remap Availability Histogram/{x.title()}": (f"remapped_rows.histogram.{x}", " bank(s)")
       for x in _HISTOGRAM},
    "EDPp Multiplier": "edpp_multiplier", "Capabilities/EGM": "x.egm",
    "Remapped Rows/Inactive Correctable Error": "x.remap.corr_inactive",
    "Remapped Rows/Inactive Uncorrectable Error": "x.remap.unc_inactive",
    "ECC Errors/Unrepairable Memory": "x.unrepairable",
}

# -q -x leaf path -> (value key, suffix appended to a value that is available)
XML_MAP = {
    "product_name": "name", "product_brand": "x.product_brand",
    "product_architecture": "x.product_architecture", "persistence_mode": "persistence_mode",
    "addressing_mode": "addressing_mode", "accounting_mode": "accounting.mode", "accounting_mode_buffer_size": "accounting.buffer_size",
    "mig_mode/current_mig": "mig.mode.current", "mig_mode/pending_mig": "mig.mode.pending",
    "serial": "serial", "uuid": "uuid", "minor_number": "x.minor_number",
    "vbios_version": "vbios_version", "multigpu_board": "x.multigpu_board", "board_id": "x.board_id",
    "board_part_number": "x.board_part_number", "gpu_part_number": "x.gpu_part_number",
    "platformInfo/module_id": "platform.module_id",
    "inforom_version/img_version": "inforom.img", "inforom_version/oem_object": "inforom.oem",
    "inforom_version/ecc_object": "inforom.ecc", "inforom_version/pwr_object": "inforom.pwr",
    "gsp_firmware_version": "x.gsp_firmware_version",
    "pci/pci_bus": "pci.bus", "pci/pci_device": "pci.device", "pci/pci_domain": "pci.domain",
    "pci/pci_base_class": "pci.baseClass", "pci/pci_sub_class": "pci.subClass",
    "pci/pci_device_id": "pci.device_id", "pci/pci_bus_id": "pci.bus_id",
    "pci/pci_sub_system_id": "pci.sub_device_id",
    "pci/pci_gpu_link_info/pcie_gen/max_link_gen": "pcie.link.gen.max",
    "pci/pci_gpu_link_info/pcie_gen/current_link_gen": "pcie.link.gen.current",
    "pci/pci_gpu_link_info/pcie_gen/device_current_link_gen": "pcie.link.gen.gpucurrent",
    "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen": "pcie.link.gen.gpumax",
    "pci/pci_gpu_link_info/pcie_gen/max_host_link_gen": "pcie.link.gen.hostmax",
    "pci/pci_gpu_link_info/link_widths/max_link_width": ("pcie.link.width.max", "x"),
    "pci/pci_gpu_link_info/link_widths/current_link_width": ("pcie.link.width.current", "x"),
    "pci/replay_counter": "x.pcie.replay", "pci/tx_util": "x.pcie.tx", "pci/rx_util": "x.pcie.rx",
    "fan_speed": "fan.speed", "performance_state": "pstate",
    "clocks_event_reasons/clocks_event_reason_gpu_idle": "clocks_event_reasons.gpu_idle",
    "clocks_event_reasons/clocks_event_reason_applications_clocks_setting":
        "clocks_event_reasons.applications_clocks_setting",
    "clocks_event_reasons/clocks_event_reason_sw_power_cap": "clocks_event_reasons.sw_power_cap",
    "clocks_event_reasons/clocks_event_reason_hw_slowdown": "clocks_event_reasons.hw_slowdown",
    "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown": "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons/clocks_event_reason_hw_power_brake_slowdown":
        "clocks_event_reasons.hw_power_brake_slowdown",
    "clocks_event_reasons/clocks_event_reason_sync_boost": "clocks_event_reasons.sync_boost",
    "clocks_event_reasons/clocks_event_reason_sw_thermal_slowdown": "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons/clocks_event_reason_display_clocks_setting": "x.display_clock_setting",
    "fb_memory_usage/total": "memory.total", "fb_memory_usage/reserved": "memory.reserved",
    "fb_memory_usage/used": "memory.used", "fb_memory_usage/free": "memory.free",
    "bar1_memory_usage/total": "x.bar1.total", "bar1_memory_usage/used": "x.bar1.used",
    "bar1_memory_usage/free": "x.bar1.free", "compute_mode": "compute_mode",
    "utilization/gpu_util": "utilization.gpu", "utilization/memory_util": "utilization.memory",
    "utilization/encoder_util": "utilization.encoder", "utilization/decoder_util": "utilization.decoder",
    "ecc_mode/current_ecc": "ecc.mode.current", "ecc_mode/pending_ecc": "ecc.mode.pending",
    "ecc_errors/volatile/sram_correctable": "x.ecc.sram.corr.vol",
    "ecc_errors/volatile/dram_correctable": "x.ecc.dram.corr.vol",
    "ecc_errors/volatile/dram_uncorrectable": "x.ecc.dram.unc.vol",
    "ecc_errors/aggregate/sram_correctable": "x.ecc.sram.corr.agg",
    "ecc_errors/aggregate/dram_correctable": "x.ecc.dram.corr.agg",
    "ecc_errors/aggregate/dram_uncorrectable": "x.ecc.dram.unc.agg",
    "retired_pages/multiple_single_bit_retirement/retired_count": "retired_pages.single_bit_ecc.count",
    "retired_pages/double_bit_retirement/retired_count": "retired_pages.double_bit.count",
    "retired_pages/pending_retirement": "retired_pages.pending",
    "remapped_rows/remapped_row_corr": "remapped_rows.correctable",
    "remapped_rows/remapped_row_unc": "remapped_rows.uncorrectable",
    "remapped_rows/remapped_row_pending": "remapped_rows.pending",
    "remapped_rows/remapped_row_failure": "remapped_rows.failure",
    "temperature/gpu_temp": ("temperature.gpu", " C"),
    "temperature/gpu_temp_tlimit": ("temperature.gpu.tlimit", " C"),
    "temperature/gpu_temp_max_threshold": "x.temp.shutdown",
    "temperature/gpu_temp_slow_threshold": "x.temp.slowdown",
    "temperature/gpu_temp_max_gpu_threshold": "x.temp.max_gpu",
    "temperature/gpu_temp_max_mem_threshold": "x.temp.max_mem",
    "temperature/gpu_temp_max_tlimit_threshold": "x.temp.shutdown_tlimit",
    "temperature/gpu_temp_slow_tlimit_threshold": "x.temp.slowdown_tlimit",
    "temperature/gpu_temp_max_gpu_tlimit_threshold": "x.temp.max_gpu_tlimit",
    "temperature/gpu_temp_max_mem_tlimit_threshold": "x.temp.max_mem_tlimit",
    "temperature/gpu_target_temperature": "x.temp.target",
    "temperature/memory_temp": ("temperature.memory", " C"),
    "gpu_power_readings/power_state": "x.power_state",
    "gpu_power_readings/power_draw": "power.draw",
    "gpu_power_readings/average_power_draw": "power.draw.average",
    "gpu_power_readings/instant_power_draw": "power.draw.instant",
    "gpu_power_readings/current_power_limit": "enforced.power.limit",
    "gpu_power_readings/requested_power_limit": "power.limit",
    "gpu_power_readings/default_power_limit": "power.default_limit",
    "gpu_power_readings/min_power_limit": "power.min_limit",
    "gpu_power_readings/max_power_limit": "power.max_limit",
    "clocks/graphics_clock": "clocks.current.graphics", "clocks/sm_clock": "clocks.current.sm",
    "clocks/mem_clock": "clocks.current.memory", "clocks/video_clock": "clocks.current.video",
    "applications_clocks/graphics_clock": "clocks.applications.graphics",
    "applications_clocks/mem_clock": "clocks.applications.memory",
    "default_applications_clocks/graphics_clock": "clocks.default_applications.graphics",
    "default_applications_clocks/mem_clock": "clocks.default_applications.memory",
    "max_clocks/graphics_clock": "clocks.max.graphics", "max_clocks/sm_clock": "clocks.max.sm",
    "max_clocks/mem_clock": "clocks.max.memory", "max_clocks/video_clock": "x.clocks.max.video",
    "max_customer_boost_clocks/graphics_clock": "x.clocks.max_boost.graphics",
    "fabric/state": "fabric.state", "fabric/status": "fabric.status", "fabric/cliqueId": "fabric.cliqueId",
    "fabric/clusterUuid": "fabric.clusterUuid",
    "fabric/health/summary": "fabric.health.summary", "fabric/health/bandwidth": "fabric.health.bandwidth",
    "fabric/health/route_recovery_in_progress": "fabric.health.route_recovery_in_progress",
    "fabric/health/route_unhealthy": "fabric.health.route_unhealthy",
    "fabric/health/access_timeout_recovery": "fabric.health.access_timeout_recovery",
    "fabric/health/incorrect_configuration": "fabric.health.incorrect_configuration",
    "supported_clocks/supported_mem_clock/value": "x.supported_mem_clock",
    "supported_clocks/supported_mem_clock/supported_graphics_clock": "x.supported_graphics_clock",
    **XML_VALUES,
}

# -q text label path -> value key (same values, the text spelling of the same data)
TEXT_MAP = {
    "Product Name": "name", "Product Brand": "x.product_brand",
    "Product Architecture": "x.product_architecture", "Persistence Mode": "persistence_mode",
    "Addressing Mode": "addressing_mode",
    "Accounting Mode": "accounting.mode", "Accounting Mode Buffer Size": "accounting.buffer_size",
    "MIG Mode/Current": "mig.mode.current", "MIG Mode/Pending": "mig.mode.pending",
    "Serial Number": "serial", "GPU UUID": "uuid", "Minor Number": "x.minor_number",
    "VBIOS Version": "vbios_version", "MultiGPU Board": "x.multigpu_board", "Board ID": "x.board_id",
    "Board Part Number": "x.board_part_number", "GPU Part Number": "x.gpu_part_number", "Platform Info/Module Id": "platform.module_id",
    "Inforom Version/Image Version": "inforom.img", "Inforom Version/OEM Object": "inforom.oem",
    "Inforom Version/ECC Object": "inforom.ecc", "Inforom Version/Power Management Object": "inforom.pwr",
    "GSP Firmware Version": "x.gsp_firmware_version",
    "PCI/Bus": "pci.bus", "PCI/Device": "pci.device", "PCI/Domain": "pci.domain",
    "PCI/Base Classcode": "pci.baseClass", "PCI/Sub Classcode": "pci.subClass",
    "PCI/Device Id": "pci.device_id", "PCI/Bus Id": "pci.bus_id", "PCI/Sub System Id": "pci.sub_device_id",
    "PCI/GPU Link Info/PCIe Generation/Max": "pcie.link.gen.max",
    "PCI/GPU Link Info/PCIe Generation/Current": "pcie.link.gen.current",
    "PCI/GPU Link Info/PCIe Generation/Device Current": "pcie.link.gen.gpucurrent",
    "PCI/GPU Link Info/PCIe Generation/Device Max": "pcie.link.gen.gpumax",
    "PCI/GPU Link Info/PCIe Generation/Host Max": "pcie.link.gen.hostmax",
    "PCI/GPU Link Info/Link Width/Max": ("pcie.link.width.max", "x"),
    "PCI/GPU Link Info/Link Width/Current": ("pcie.link.width.current", "x"),
    "PCI/Replays Since Reset": "x.pcie.replay", "PCI/Tx Throughput": "x.pcie.tx",
    "PCI/Rx Throughput": "x.pcie.rx", "Fan Speed": "fan.speed", "Performance State": "pstate",
    "Clocks Event Reasons/Idle": "clocks_event_reasons.gpu_idle",
    "Clocks Event Reasons/Applications Clocks Setting": "clocks_event_reasons.applications_clocks_setting",
    "Clocks Event Reasons/SW Power Cap": "clocks_event_reasons.sw_power_cap",
    "Clocks Event Reasons/HW Slowdown": "clocks_event_reasons.hw_slowdown",
    "Clocks Event Reasons/HW Slowdown/HW Thermal Slowdown": "clocks_event_reasons.hw_thermal_slowdown",
    "Clocks Event Reasons/HW Slowdown/HW Power Brake Slowdown": "clocks_event_reasons.hw_power_brake_slowdown",
    "Clocks Event Reasons/Sync Boost": "clocks_event_reasons.sync_boost",
    "Clocks Event Reasons/SW Thermal Slowdown": "clocks_event_reasons.sw_thermal_slowdown",
    "Clocks Event Reasons/Display Clock Setting": "x.display_clock_setting",
    "FB Memory Usage/Total": "memory.total", "FB Memory Usage/Reserved": "memory.reserved",
    "FB Memory Usage/Used": "memory.used", "FB Memory Usage/Free": "memory.free",
    "BAR1 Memory Usage/Total": "x.bar1.total", "BAR1 Memory Usage/Used": "x.bar1.used",
    "BAR1 Memory Usage/Free": "x.bar1.free", "Compute Mode": "compute_mode",
    "Utilization/GPU": "utilization.gpu", "Utilization/Memory": "utilization.memory",
    "Utilization/Encoder": "utilization.encoder", "Utilization/Decoder": "utilization.decoder",
    "ECC Mode/Current": "ecc.mode.current", "ECC Mode/Pending": "ecc.mode.pending",
    "ECC Errors/Volatile/SRAM Correctable": "x.ecc.sram.corr.vol",
    "ECC Errors/Volatile/DRAM Correctable": "x.ecc.dram.corr.vol",
    "ECC Errors/Volatile/DRAM Uncorrectable": "x.ecc.dram.unc.vol",
    "ECC Errors/Aggregate/SRAM Correctable": "x.ecc.sram.corr.agg",
    "ECC Errors/Aggregate/DRAM Correctable": "x.ecc.dram.corr.agg",
    "ECC Errors/Aggregate/DRAM Uncorrectable": "x.ecc.dram.unc.agg",
    "Retired Pages/Single Bit ECC": "retired_pages.single_bit_ecc.count",
    "Retired Pages/Double Bit ECC": "retired_pages.double_bit.count",
    "Retired Pages/Pending Page Blacklist": "retired_pages.pending",
    "Remapped Rows/Correctable Error": "remapped_rows.correctable",
    "Remapped Rows/Uncorrectable Error": "remapped_rows.uncorrectable",
    "Remapped Rows/Pending": "remapped_rows.pending",
    "Remapped Rows/Remapping Failure Occurred": "remapped_rows.failure",
    "Temperature/GPU Current Temp": ("temperature.gpu", " C"),
    "Temperature/GPU T.Limit Temp": ("temperature.gpu.tlimit", " C"),
    "Temperature/GPU Shutdown T.Limit Temp": "x.temp.shutdown_tlimit",
    "Temperature/GPU Slowdown T.Limit Temp": "x.temp.slowdown_tlimit",
    "Temperature/GPU Max Operating T.Limit Temp": "x.temp.max_gpu_tlimit",
    "Temperature/GPU Shutdown Temp": "x.temp.shutdown",
    "Temperature/GPU Slowdown Temp": "x.temp.slowdown",
    "Temperature/GPU Max Operating Temp": "x.temp.max_gpu",
    "Temperature/GPU Target Temperature": "x.temp.target",
    "Temperature/Memory Current Temp": ("temperature.memory", " C"),
    "Temperature/Memory Max Operating T.Limit Temp": "x.temp.max_mem_tlimit",
    "Temperature/Memory Max Operating Temp": "x.temp.max_mem",
    "GPU Power Readings/Average Power Draw": "power.draw.average",
    "GPU Power Readings/Instantaneous Power Draw": "power.draw.instant",
    "GPU Power Readings/Current Power Limit": "enforced.power.limit",
    "GPU Power Readings/Requested Power Limit": "power.limit",
    "GPU Power Readings/Default Power Limit": "power.default_limit",
    "GPU Power Readings/Min Power Limit": "power.min_limit",
    "GPU Power Readings/Max Power Limit": "power.max_limit",
    "Clocks/Graphics": "clocks.current.graphics", "Clocks/SM": "clocks.current.sm",
    "Clocks/Memory": "clocks.current.memory", "Clocks/Video": "clocks.current.video",
    "Applications Clocks/Graphics": "clocks.applications.graphics",
    "Applications Clocks/Memory": "clocks.applications.memory",
    "Default Applications Clocks/Graphics": "clocks.default_applications.graphics",
    "Default Applications Clocks/Memory": "clocks.default_applications.memory",
    "Max Clocks/Graphics": "clocks.max.graphics", "Max Clocks/SM": "clocks.max.sm",
    "Max Clocks/Memory": "clocks.max.memory", "Max Clocks/Video": "x.clocks.max.video",
    "Max Customer Boost Clocks/Graphics": "x.clocks.max_boost.graphics",
    "Fabric/State": "fabric.state", "Fabric/Status": "fabric.status", "Fabric/CliqueId": "fabric.cliqueId",
    "Fabric/ClusterUUID": "fabric.clusterUuid",
    "Fabric/Health/Summary": "fabric.health.summary", "Fabric/Health/Bandwidth": "fabric.health.bandwidth",
    "Fabric/Health/Route Recovery in progress": "fabric.health.route_recovery_in_progress",
    "Fabric/Health/Route Unhealthy": "fabric.health.route_unhealthy",
    "Fabric/Health/Access Timeout Recovery": "fabric.health.access_timeout_recovery",
    "Fabric/Health/Incorrect Configuration": "fabric.health.incorrect_configuration",
    **TEXT_VALUES,
}

# Older branches' names of the same values (records of 470-550).
XML_MAP.update({
    "gpu_module_id": "platform.module_id",
    **{f"clocks_throttle_reasons/clocks_throttle_reason_{k.split('_reason_', 1)[1]}": v
       for k, v in XML_MAP.items() if k.startswith("clocks_event_reasons/")},
    "power_readings/power_state": "x.power_state", "power_readings/power_management": "power.management",
    "power_readings/power_draw": "power.draw", "power_readings/power_limit": "power.limit",
    "power_readings/default_power_limit": "power.default_limit",
    "power_readings/enforced_power_limit": "enforced.power.limit",
    "power_readings/min_power_limit": "power.min_limit", "power_readings/max_power_limit": "power.max_limit",
})
TEXT_MAP.update({
    "Module ID": "platform.module_id", "Utilization/Gpu": "utilization.gpu",
    "Ecc Mode/Current": "ecc.mode.current", "Ecc Mode/Pending": "ecc.mode.pending",
    **{k.replace("Clocks Event Reasons", "Clocks Throttle Reasons"): v
       for k, v in TEXT_MAP.items() if k.startswith("Clocks Event Reasons/")},
    "Power Readings/Power Management": "power.management", "Power Readings/Power Draw": "power.draw",
    "Power Readings/Power Limit": "power.limit", "Power Readings/Default Power Limit": "power.default_limit",
    "Power Readings/Enforced Power Limit": "enforced.power.limit",
    "Power Readings/Min Power Limit": "power.min_limit", "Power Readings/Max Power Limit": "power.max_limit",
    "GPU Power Readings/Power Draw": "power.draw",
})

# Leaves whose structure is rebuilt at run time (lists): their subtree is not copied.
DYNAMIC = {"processes": "processes", "accounted_processes": "accounted_processes", "mig_devices": "mig_devices"}


def section(text: str, title: str) -> str:
    """The body of one `# <title>` section of an nvidia_gpu_exporter capture."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line == f"# {title}":
            j = i + 1
            while not lines[j].startswith("####"):
                j += 1
            body = []
            for k in range(j + 1, len(lines)):
                if lines[k].startswith("################"):
                    break
                body.append(lines[k])
            while body and body[-1] == "":
                body.pop()
            return "\n".join(body) + "\n"
    raise SystemExit(f"section {title!r} not in capture")


def c_str(s: str) -> str:
    out = []
    for line in s.splitlines(keepends=True):
        esc = line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        out.append(f'    "{esc}"')
    return "\n".join(out) if out else '    ""'


def ident(name: str) -> str:
    return "K_" + re.sub(r"[^A-Za-z0-9]", "_", name)


def query_fields(text: str) -> list[tuple[str, str, str]]:
    """(name, alias, unit) in --help-query-gpu order; units from the captured CSV header."""
    help_text = section(text, "capabilities :: help-query-gpu")
    fields = []
    for line in help_text.splitlines():
        m = re.fullmatch(r'"([^"]+)"(?: or "([^"]+)")?', line.strip())
        if m:
            fields.append((m.group(1), m.group(2) or ""))
    header = section(text, "idle :: query-gpu (csv, what the exporter parses)").splitlines()[0]
    units = {}
    for col in header.split(", "):
        m = re.fullmatch(r"(\S+) \[([^\]]+)\]", col)
        if m:
            units[m.group(1)] = m.group(2)
    return [(n, a, units.get(n, "")) for n, a in fields]


def xml_skeleton(path: Path) -> tuple[str, list[tuple[int, int, str, str, str]]]:
    """(product name, rows) for the first GPU of a capture. A row: (depth, kind, tag, key, suffix);
    kind 0 opens an element, 1 is a leaf, 2 closes, 3 is a run-time list."""
    gpu = ET.parse(path).getroot().find("gpu")
    rows: list[tuple[int, int, str, str, str]] = []

    def walk(e: ET.Element, prefix: str, depth: int) -> None:
        seen_children: set[str] = set()
        for c in e:
            p = f"{prefix}{c.tag}"
            if c.tag in seen_children:  # repeated list entries (supported clocks): keep one
                continue
            seen_children.add(c.tag)
            if p in DYNAMIC:
                rows.append((depth, 3, c.tag, DYNAMIC[p], ""))
            elif len(c):
                rows.append((depth, 0, c.tag, "", ""))
                walk(c, p + "/", depth + 1)
                rows.append((depth, 2, c.tag, "", ""))
            else:
                m = XML_MAP.get(p, "")
                key, suffix = m if isinstance(m, tuple) else (m, "")
                rows.append((depth, 1, c.tag, key, suffix))

    walk(gpu, "", 2)
    return gpu.findtext("product_name"), rows


def colon_column(body: list[str]) -> int:
    """Where -q puts its colons: the column of the Timestamp line's (42 before 570, 55 after)."""
    line = next(l for l in body if l.startswith("Timestamp") and ": " in l)
    return line.index(": ")


def text_skeleton(text: str, record: bool = False) -> list[tuple[int, int, str, str, str]]:
    """Rows of the first GPU of the idle -q section of a capture, or of a whole record: (depth,
    kind 0 header / 1 leaf, label, key, suffix)."""
    body = (text if record else section(text, "idle :: query (-q)")).splitlines()
    col = colon_column(body)
    start = next(i for i, l in enumerate(body) if l.startswith("GPU ")) + 1
    rows = []
    stack: list[str] = []
    for line in body[start:]:
        if not line.strip():
            break
        depth = (len(line) - len(line.lstrip(" "))) // 4 - 1
        leaf = len(line) > col and line[col] == ":"
        label = (line[:col] if leaf else line).strip()
        del stack[depth:]
        path = "/".join(stack + [label])
        if leaf:
            if path == "Processes":
                rows.append((depth, 3, label, "processes", ""))
                continue
            m = TEXT_MAP.get(path, "")
            key, suffix = m if isinstance(m, tuple) else (m, "")
            rows.append((depth, 1, label, key, suffix))
            stack.append(label)
        else:
            # a header keeps its trailing space ("GPU Memory Power Readings "), as the driver prints it
            rows.append((depth, 0, line.lstrip(" "), "", ""))
            stack.append(label)
    return rows


def help_body(text: str) -> str:
    """A help text without its first line, "NVIDIA System Management Interface -- v<version>",
    which the tool prints with the driver's version."""
    first, rest = text.split("\n", 1)
    if not re.fullmatch(r"NVIDIA System Management Interface -- v[\d.]+", first):
        raise SystemExit(f"unexpected first help line {first!r}")
    return rest


def record_fields(branch: int, fields590: list[tuple[str, str, str]]) -> list[tuple[str, str, str, str]]:
    """(name, alias, unit, key) of a branch's --query-gpu fields, in its --help-query-gpu order.
    The unit is the one its CSV header printed; the key is the value key of the 590 field of the
    same name or alias (\"\" when 590 has no such field: the tool knows it, we print [N/A])."""
    d = RECORDS / str(branch)
    fields = []
    for line in (d / "help-query-gpu.txt").read_text().splitlines():
        m = re.fullmatch(r'"([a-z][^"]*)"(?: or "([^"]+)")?', line)
        if m:
            fields.append((m.group(1), m.group(2) or ""))
    csv = (d / "query-gpu.csv").read_text().splitlines()
    by_name, by_alias = csv[0].split(", "), csv[2].split(", ")
    aliased = [f for f in fields if f[1]]
    if len(by_name) != len(fields) or len(by_alias) != len(aliased):
        raise SystemExit(f"{d}: the CSV headers do not match --help-query-gpu")
    units = {}
    for (name, _), col in zip(fields, by_name):
        m = re.fullmatch(r"(\S+)(?: \[([^\]]+)\])?", col)
        if not m or m.group(1) != name:
            raise SystemExit(f"{d}: {name} printed as {col!r}")
        units[name] = m.group(2) or ""
    for (name, alias), col in zip(aliased, by_alias):  # an alias prints its field's first name
        if col.split(" [")[0] != name:
            raise SystemExit(f"{d}: alias {alias} printed as {col!r}, not {name}")
    keys = {}
    for n, a, _ in fields590:
        keys.setdefault(n, n)
        if a:
            keys.setdefault(a, n)
    return [(n, a, units[n], keys.get(n) or keys.get(a, "")) for n, a in fields]


def table_frame(text: str) -> dict:
    """The frame of a recorded default table (one GPU, no processes): its rules, headers, the line
    between the two tables and the widths of the version line's three values."""
    lines = text.splitlines()
    m = re.fullmatch(r"\| NVIDIA-SMI (\S+ +)Driver Version: (\S+ +)CUDA Version: (\S+ +)\|", lines[2])
    if not m:
        raise SystemExit(f"unexpected version line {lines[2]!r}")
    k = next(i for i, l in enumerate(lines) if l.startswith("|==="))
    ts = lines[0]
    return {"width": len(lines[1]), "ts_pad": len(ts) - len(ts.rstrip(" ")),
            "w_smi": len(m.group(1)), "w_drv": len(m.group(2)), "w_cuda": len(m.group(3)),
            "rule": lines[1] + "\n", "grid": lines[3] + "\n", "head": "\n".join(lines[4:k + 1]) + "\n",
            "row_rule": lines[k + 4] + "\n", "gap": lines[k + 5] + "\n",
            "procs_head": "\n".join(lines[k + 7:k + 11]) + "\n", "no_procs": lines[k + 11] + "\n"}


def branch_parts(fields590, keys: dict[str, int]) -> list[str]:
    parts = []
    for b in BRANCHES:
        d = RECORDS / str(b)
        for var, name in [("HELP_TEXT", "help.txt"), ("HELP_QUERY_GPU", "help-query-gpu.txt"),
                          ("HELP_QUERY_COMPUTE_APPS", "help-query-compute-apps.txt"),
                          ("HELP_QUERY_ACCOUNTED_APPS", "help-query-accounted-apps.txt"),
                          ("HELP_QUERY_RETIRED_PAGES", "help-query-retired-pages.txt"),
                          ("HELP_QUERY_REMAPPED_ROWS", "help-query-remapped-rows.txt")]:
            text = (d / name).read_text()
            parts.append(f"static const char {var}_{b}[] =\n{c_str(help_body(text) if var == 'HELP_TEXT' else text)};\n")
        parts.append(f"static const struct qfield QUERY_GPU_FIELDS_{b}[] = {{")
        parts += [f'    {{"{n}", "{a}", "{u}", {ident(k) if k else "K_NONE"}}},' for n, a, u, k in record_fields(b, fields590)]
        parts.append("    {0, 0, 0, K_NONE},\n};\n")
        parts.append(rows_c(f"TEXT_{b}", text_skeleton((d / "query.txt").read_text(), record=True), keys))
        # -q -d: the same sections, with the sample blocks only -d prints
        parts.append(rows_c(f"TEXT_D_{b}", text_skeleton((d / "query-display.txt").read_text(), record=True), keys))
        parts.append(rows_c(f"XML_{b}", xml_skeleton(d / "query.xml")[1], keys))
    parts.append("struct frame { int width, ts_pad, w_smi, w_drv, w_cuda;\n"
                 "               const char *rule, *grid, *head, *row_rule, *gap, *procs_head, *no_procs; };")
    parts.append("struct branch { int branch, colon, dtd, unknown_rc; const char *unknown;\n"
                 "                const char *help, *help_query_gpu, *help_query_apps, *help_query_accounted,\n"
                 "                *help_query_retired, *help_query_remapped;\n"
                 "                const struct qfield *fields; const struct skel *text, *text_display, *xml;\n"
                 "                struct frame table; };")
    parts.append("/* The branches recorded from NVIDIA's own nvidia-smi (record_branches.py), oldest first. */")
    parts.append("static const struct branch BRANCHES[] = {")
    for b in BRANCHES:
        d = RECORDS / str(b)
        query = (d / "query.txt").read_text().splitlines()
        dtd = re.search(r"nvsmi_device_v(\d+)\.dtd", (d / "query.xml").read_text()).group(1)
        f = table_frame((d / "table.txt").read_text())
        frame = ", ".join(str(f[k]) for k in ("width", "ts_pad", "w_smi", "w_drv", "w_cuda"))
        frame += "".join(f",\n     {c_str(f[k]).strip()}"
                         for k in ("rule", "grid", "head", "row_rule", "gap", "procs_head", "no_procs"))
        *unknown, rc = (d / "unknown-option.txt").read_text().split("\n")[:-1]  # an argument it does not know
        unknown = "\n".join(unknown) + "\n"
        if "--no-such-option" in unknown:
            unknown = unknown.replace("--no-such-option", "%s")
        parts.append(f"    {{{b}, {colon_column(query)}, {dtd}, {int(rc)}, {c_str(unknown).strip()},\n"
                     f"     HELP_TEXT_{b}, HELP_QUERY_GPU_{b}, HELP_QUERY_COMPUTE_APPS_{b}, HELP_QUERY_ACCOUNTED_APPS_{b},\n"
                     f"     HELP_QUERY_RETIRED_PAGES_{b}, HELP_QUERY_REMAPPED_ROWS_{b},\n     QUERY_GPU_FIELDS_{b}, TEXT_{b}, TEXT_D_{b}, XML_{b},\n     {{{frame}}}}},")
    parts.append("    {0},\n};\n")
    return parts


def rows_c(name: str, rows, keys: dict[str, int]) -> str:
    out = [f"static const struct skel {name}[] = {{"]
    for depth, kind, tag, key, suffix in rows:
        k = ident(key) if key else "K_NONE"
        if key and key not in keys:
            raise SystemExit(f"{name}: unknown key {key!r}")
        out.append(f'    {{{depth}, {kind}, {k}, "{tag}", "{suffix}"}},')
    out.append("    {0, 9, K_NONE, 0, 0},\n};")
    return "\n".join(out)


def generate() -> str:
    h100 = (CAPTURES / TEXT_H100).read_text()
    l40s = (CAPTURES / TEXT_L40S).read_text()
    fields = query_fields(h100)
    keys: dict[str, int] = {}
    for n, _, _ in fields:
        keys.setdefault(n, len(keys))
    for k in EXTRA_KEYS + ["processes", "accounted_processes", "mig_devices"]:
        keys.setdefault(k, len(keys))
    parts = ["/* Generated by shims/nvidia-smi/gen_smi.py from tests/fixtures/captures; do not edit. */",
             "#ifndef SMI_GEN_H", "#define SMI_GEN_H", "", "enum key {", "    K_NONE = -1,"]
    parts += [f"    {ident(k)} = {v}," for k, v in keys.items()]
    parts += ["    K_COUNT", "};", ""]
    parts.append("struct qfield { const char *name, *alias, *unit; enum key key; };")
    parts.append("struct skel { signed char depth, kind; short key; const char *tag, *suffix; };")
    parts.append("static const struct qfield QUERY_GPU_FIELDS[] = {")
    parts += [f'    {{"{n}", "{a}", "{u}", {ident(n)}}},' for n, a, u in fields]
    parts.append("    {0, 0, 0, K_NONE},\n};\n")
    for var, title in [("HELP_TEXT", "capabilities :: help (-h)"),
                       ("HELP_QUERY_GPU", "capabilities :: help-query-gpu"),
                       ("HELP_QUERY_COMPUTE_APPS", "capabilities :: help-query-compute-apps")]:
        text = section(h100, title)
        if var == "HELP_TEXT":
            parts.append(f'static const char HELP_VERSION[] = "{text.split(" -- v", 1)[1].split(chr(10), 1)[0]}";')
        parts.append(f"static const char {var}[] =\n{c_str(help_body(text) if var == 'HELP_TEXT' else text)};\n")
    boards = []
    for b in XML_BOARDS:
        product, rows = xml_skeleton(CAPTURES / f"nvidia-smi-q-x.{b}.xml")
        parts.append(rows_c(f"XML_{b.upper()}", rows, keys))
        boards.append((b, product))
    parts.append("struct board { const char *profile, *product; const struct skel *xml; };")
    parts.append("static const struct board XML_BOARDS[] = {")
    parts += [f'    {{"{b}", "{p}", XML_{b.upper()}}},' for b, p in boards]
    parts.append("    {0, 0, 0},\n};\n")
    parts.append(rows_c("TEXT_590", text_skeleton(h100), keys))
    parts.append(rows_c("TEXT_595", text_skeleton(l40s), keys))
    parts.append(f"static const int TEXT_590_COLON = {colon_column(section(h100, 'idle :: query (-q)').splitlines())}, "
                 f"TEXT_595_COLON = {colon_column(section(l40s, 'idle :: query (-q)').splitlines())};\n")
    parts += branch_parts(fields, keys)
    parts.append("\n#endif")
    return "\n".join(parts) + "\n"


def main() -> int:
    out = generate()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != out:
            print(f"{OUT} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
