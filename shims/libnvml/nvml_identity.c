/*
 * libnvidia-ml: what a GPU is. Name, UUID, serial, board, VBIOS, inforom, brand, architecture,
 * compute capability, NUMA node, PCI (info, link generation and width, throughput), attributes
 * and the GSP firmware. A MIG device handle has its own name, UUID and attributes (docs/mig.md).
 */
#include "nvml_internal.h"

#include <stdio.h>

/* ---- identity ------------------------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEV_FLAGS(device, DEV_LOST_OK | DEV_MIG_OK);
    return mig_dev ? STRING(mig_dev->name, name, length) : STRING(g->name, name, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEV_FLAGS(device, DEV_LOST_OK | DEV_MIG_OK);
    return mig_dev ? STRING(mig_dev->uuid, uuid, length) : STRING(g->uuid, uuid, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEV_STATIC(device);
    return STRING(g->serial, serial, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber, unsigned int length)
{
    DEV(device);
    return STRING(g->board_part_number, partNumber, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    DEV(device);
    return STRING(g->vbios_version, version, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    DEV(device);
    return STRING(g->inforom_image, version, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object, char *version,
                                                 unsigned int length)
{
    DEV(device);
    switch (object) {
    case NVML_INFOROM_OEM: return STRING(g->inforom_oem, version, length);
    case NVML_INFOROM_ECC: return STRING(g->inforom_ecc, version, length);
    case NVML_INFOROM_POWER:
        if (field_equals(s, g->inforom_power, sizeof(g->inforom_power), "N/A"))
            return NVML_ERROR_NOT_SUPPORTED;
        return STRING(g->inforom_power, version, length);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

/* A GPU's index; on a MIG device handle, the index nvmlDeviceGetMigDeviceHandleByIndex takes for
   it on its parent, as nvml.h documents. NVIDIA's nvidia-smi asks it of every MIG device: where it
   fails, its default table says "No MIG devices found" and -q has no MIG Device blocks. */
nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEV_FLAGS(device, DEV_LOST_OK | DEV_MIG_OK);
    ARG(index);
    if (mig_dev) { /* its place among the MIG devices this process sees */
        unsigned int k = 0;
        for (const struct mokka_mig_device *md = g->mig_devices; md < mig_dev; md++)
            k += view_mig(g, md) != 0;
        *index = k;
        return NVML_SUCCESS;
    }
    /* The index this process enumerates it by (mokka_view.h), not the node's. */
    int16_t v = g_view.index[gpu_index(s, g)];
    *index = v < 0 ? 0 : (unsigned int)v;
    return NVML_SUCCESS;
}
U32_GETTER(nvmlDeviceGetMinorNumber, minor, DEV_STATIC)
U32_GETTER(nvmlDeviceGetBoardId, board_id, DEV)
U32_GETTER(nvmlDeviceGetModuleId, module_id, DEV)
U32_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen, DEV)
U32_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_max_gen, DEV)
U32_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width, DEV)
U32_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_cur_gen, DEV)
U32_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_cur_width, DEV)
U32_GETTER(nvmlDeviceGetPcieReplayCounter, pcie_replay, DEV)

nvmlReturn_t DECLDIR nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int *multiGpuBool)
{
    DEV(device);
    ARG(multiGpuBool);
    *multiGpuBool = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPcieLinkMaxSpeed(nvmlDevice_t device, unsigned int *maxSpeed)
{
    static const unsigned mbps[] = {0, 2500, 5000, 8000, 16000, 32000, 64000};
    DEV(device);
    ARG(maxSpeed);
    uint32_t gen;
    SNAP(s, g->pcie_max_gen, gen);
    *maxSpeed = gen < 7 ? mbps[gen] : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value)
{
    DEV(device);
    ARG(value);
    uint32_t v;
    if (counter == NVML_PCIE_UTIL_TX_BYTES)
        SNAP(s, g->pcie_tx_kbps, v);
    else if (counter == NVML_PCIE_UTIL_RX_BYTES)
        SNAP(s, g->pcie_rx_kbps, v);
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    *value = v;
    return NVML_SUCCESS;
}

FIELD_GETTER(nvmlDeviceGetBrand, nvmlBrandType_t, brand, DEV, (nvmlBrandType_t)v)

FIELD_GETTER(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, architecture, DEV, v)

PAIR_GETTER(nvmlDeviceGetCudaComputeCapability, int, cc_major, cc_minor)

nvmlReturn_t DECLDIR nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    DEV(device);
    ARG(node);
    int32_t v;
    SNAP(s, g->numa_node, v);
    if (v < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)v;
    return NVML_SUCCESS;
}

static void fill_pci(const struct mokka_state *s, const struct mokka_gpu *g, nvmlPciInfo_t *pci, int legacy_bus_id)
{
    struct mokka_gpu c;
    MOKKA_CONSISTENT(s) {
        memcpy(c.bus_id, g->bus_id, sizeof(c.bus_id));
        memcpy(c.bus_id_legacy, g->bus_id_legacy, sizeof(c.bus_id_legacy));
        c.pci_domain = g->pci_domain;
        c.pci_bus = g->pci_bus;
        c.pci_device = g->pci_device;
        c.pci_device_id = g->pci_device_id;
        c.pci_subsystem_id = g->pci_subsystem_id;
    }
    memset(pci, 0, sizeof(*pci));
    c.bus_id[sizeof(c.bus_id) - 1] = c.bus_id_legacy[sizeof(c.bus_id_legacy) - 1] = '\0';
    /* v1 (nvmlDeviceGetPciInfo) reported the legacy 4-digit domain in busId too. */
    snprintf(pci->busId, sizeof(pci->busId), "%s", legacy_bus_id ? c.bus_id_legacy : c.bus_id);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%s", c.bus_id_legacy);
    pci->domain = c.pci_domain;
    pci->bus = c.pci_bus;
    pci->device = c.pci_device;
    pci->pciDeviceId = c.pci_device_id;
    pci->pciSubSystemId = c.pci_subsystem_id;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEV_STATIC(device);
    ARG(pci);
    fill_pci(s, g, pci, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    DEV_STATIC(device);
    VERSIONED_ARG(pci, nvmlPciInfoExt_v1);
    nvmlPciInfo_t base;
    uint32_t cls;
    fill_pci(s, g, &base, 0);
    SNAP(s, g->pci_class, cls);
    memset(pci, 0, sizeof(*pci));
    pci->version = nvmlPciInfoExt_v1;
    pci->domain = base.domain;
    pci->bus = base.bus;
    pci->device = base.device;
    pci->pciDeviceId = base.pciDeviceId;
    pci->pciSubSystemId = base.pciSubSystemId;
    pci->baseClass = (cls >> 16) & 0xFF;
    pci->subClass = (cls >> 8) & 0xFF;
    snprintf(pci->busId, sizeof(pci->busId), "%s", base.busId);
    return NVML_SUCCESS;
}

/* Every board we simulate runs its GSP firmware, whose version is the driver's (the captures
   show gsp_firmware_version equal to driver_version on all seven boards). */
nvmlReturn_t DECLDIR nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char *version)
{
    DEV(device);
    ARG(version);
    return STRING(s->driver_version, version, NVML_GSP_FIRMWARE_VERSION_BUF_SIZE);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned int *isEnabled,
                                                  unsigned int *defaultMode)
{
    DEV(device);
    ARG(isEnabled);
    ARG(defaultMode);
    *isEnabled = 1;
    *defaultMode = 1;
    return NVML_SUCCESS;
}

/* The InfoROM's checksum holds on every simulated board (the H100 590 and L40S 595 captures'
   inforom.checksum_validation is "valid"); nothing corrupts one. */
nvmlReturn_t DECLDIR nvmlDeviceValidateInforom(nvmlDevice_t device)
{
    DEV(device);
    (void)s;
    (void)g;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEV_STATIC(device);
    ARG(pci);
    fill_pci(s, g, pci, 1);
    return NVML_SUCCESS;
}

/* The compute slices of a MIG device's compute profile: its placement size is the span the
   driver gives it (4 for a 3-slice one), not its slice count. A full-size compute instance (the
   usual one, with all its GPU instance's SMs) has its GPU instance's; a smaller one's is looked
   up in the board's tables. */
static unsigned int ci_slice_count(const struct mokka_state *s, const struct mokka_mig_gi *gi,
                                   const struct mokka_mig_device *md)
{
    if (md->multiprocessor_count == gi->multiprocessor_count)
        return gi->slice_count;
    for (unsigned int k = 0; k < s->mig_profile_count && k < MOKKA_MAX_MIG_PROFILES; k++) {
        const struct mokka_mig_profile *p = &s->mig_profiles[k];
        for (unsigned int j = 0; p->index == gi->profile && j < p->ci_profile_count && j < MOKKA_MAX_CI_PROFILES; j++)
            if (p->ci_profiles[j].id == md->profile)
                return p->ci_profiles[j].slice_count;
    }
    return 0;
}

/* A MIG device's: its compute instance's SMs and slices, its GPU instance's engines (shared by
   the compute instances in it), slices and memory. */
static void mig_attributes(const struct mokka_state *s, const struct mokka_gpu *g, const struct mokka_mig_device *md,
                           nvmlDeviceAttributes_t *a)
{
    const struct mokka_mig_gi *gi = mig_gi_of(g, md);
    memset(a, 0, sizeof(*a));
    MOKKA_CONSISTENT(s) {
        a->multiprocessorCount = md->multiprocessor_count;
        a->computeInstanceSliceCount = ci_slice_count(s, gi, md);
        a->sharedCopyEngineCount = gi->copy_engine_count;
        a->sharedDecoderCount = gi->decoder_count;
        a->sharedEncoderCount = gi->encoder_count;
        a->sharedJpegCount = gi->jpeg_count;
        a->sharedOfaCount = gi->ofa_count;
        a->gpuInstanceSliceCount = gi->slice_count;
        a->memorySizeMB = gi->memory_total >> 20;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    DEV_FLAGS(device, DEV_MIG_OK);
    ARG(attributes);
    if (mig_dev) {
        mig_attributes(s, g, mig_dev, attributes);
        return NVML_SUCCESS;
    }
    uint32_t sms;
    uint64_t total;
    SNAP(s, g->multiprocessor_count, sms);
    SNAP(s, g->mem_total, total);
    memset(attributes, 0, sizeof(*attributes));
    attributes->multiprocessorCount = sms;
    attributes->sharedCopyEngineCount = 0;
    attributes->gpuInstanceSliceCount = 0;
    attributes->computeInstanceSliceCount = 0;
    attributes->memorySizeMB = total >> 20;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* The GPU's PDI (-q "GPU PDI"; the captures of 580 and later have it on every board, T4
   included): the model's, derived from the UUID (model/identity.py). */
nvmlReturn_t DECLDIR nvmlDeviceGetPdi(nvmlDevice_t device, nvmlPdi_t *pdi)
{
    DEV_STATIC(device);
    VERSIONED_ARG(pdi, nvmlPdi_v1);
    uint64_t v;
    SNAP(s, g->pdi, v);
    pdi->value = v;
    return NVML_SUCCESS;
}

/* The C2C link to the CPU (Hopper and later): up where a Grace CPU hosts the GPU (GB200 and
   GB300 "Enabled", H100 and B200 behind PCIe "Disabled", as their captures say). */
nvmlReturn_t DECLDIR nvmlDeviceGetC2cModeInfoV(nvmlDevice_t device, nvmlC2cModeInfo_v1_t *c2cModeInfo)
{
    DEV(device);
    ARG(c2cModeInfo);
    uint32_t mode;
    SNAP(s, g->c2c_mode, mode);
    if (!mode)
        return NVML_ERROR_NOT_SUPPORTED;
    c2cModeInfo->isC2cEnabled = mode == 2;
    return NVML_SUCCESS;
}

/* A simulated node is bare metal: no hypervisor passes the GPU through (the captures, taken in
   cloud VMs, say Pass-Through; GB300's, on bare metal, None). */
nvmlReturn_t DECLDIR nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, nvmlGpuVirtualizationMode_t *pVirtualMode)
{
    DEV(device);
    (void)g;
    ARG(pVirtualMode);
    *pVirtualMode = NVML_GPU_VIRTUALIZATION_MODE_NONE;
    return NVML_SUCCESS;
}

/* Device capabilities: EGM (extended GPU memory, Grace's memory mapped to the GPU) is off on
   every captured board, and the model has none. */
nvmlReturn_t DECLDIR nvmlDeviceGetCapabilities(nvmlDevice_t device, nvmlDeviceCapabilities_t *caps)
{
    DEV(device);
    (void)g;
    VERSIONED_ARG(caps, nvmlDeviceCapabilities_v1);
    caps->capMask = 0;
    return NVML_SUCCESS;
}
