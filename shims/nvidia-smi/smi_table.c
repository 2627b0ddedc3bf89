/* nvidia-smi's default table, -L and --version. */
#include "smi.h"

#include <string.h>

int cmd_list(void)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS) {
            print_handle_error(d);
            g_exit = EXIT_LOST;
            continue;
        }
        char name[96] = "N/A", uuid[96] = "N/A";
        NV(nvmlDeviceGetName, d->h, name, sizeof(name));
        NV(nvmlDeviceGetUUID, d->h, uuid, sizeof(uuid));
        printf("GPU %u: %s (UUID: %s)\n", d->index, name, uuid);
        mig_list(d->index);
    }
    return g_exit;
}

int cmd_version(void)
{
    char nvml[96] = "N/A";
    NV(nvmlSystemGetNVMLVersion, nvml, sizeof(nvml));
    /* NVML says "13.590.48.01" (CUDA major first); the tool prints the driver's "590.48" */
    char *first = strchr(nvml, '.');
    if (first && strchr(first + 1, '.')) {
        memmove(nvml, first + 1, strlen(first + 1) + 1);
        char *dot = strchr(nvml, '.');
        char *second = dot ? strchr(dot + 1, '.') : NULL;
        if (second)
            *second = 0;
    }
    printf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\nCUDA Version        : %s\n",
           g_driver, nvml, g_driver, g_cuda);
    return 0;
}

static void fit(char *s, size_t width, int keep_tail)
{
    size_t l = strlen(s);
    if (l <= width)
        return;
    if (keep_tail) {  /* ".../usr/lib/firefox/firefox" */
        memmove(s + 3, s + l - (width - 3), width - 3 + 1);
        memcpy(s, "...", 3);
    } else {
        strcpy(s + width - 3, "...");
    }
}

/* The frame of the default table: a recorded branch's (before 570: 79 columns up to 525, 89 in
   535, 91 from 550), else the 91 columns of the captures. */
static void table(void)
{
    const struct frame *fr = g_rec ? &g_rec->table : NULL;
    int wide = !fr || fr->width == 91, narrow = fr && fr->width == 79;
    const char *rule = fr ? fr->rule : "+-----------------------------------------------------------------------------------------+\n";
    const char *grid = fr ? fr->grid : g_branch >= 580 ? "+-----------------------------------------+------------------------+----------------------+\n"
                                       : "|-----------------------------------------+------------------------+----------------------+\n";
    char ts[64];
    timestamp(ts, sizeof(ts), 0);
    printf("%s%*s\n", ts, fr ? fr->ts_pad : 7, "");
    printf("%s", rule);
    printf("| NVIDIA-SMI %-*sDriver Version: %-*sCUDA Version: %-*s|\n", fr ? fr->w_smi : 23, g_driver,
           fr ? fr->w_drv : 15, g_driver, fr ? fr->w_cuda : 9, g_cuda);
    printf("%s", grid);
    printf("%s", fr ? fr->head :
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n"
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n"
           "|                                         |                        |               MIG M. |\n"
           "|=========================================+========================+======================|\n");
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        char name[96] = "N/A", pers[8] = "N/A", bus[32] = "N/A", disp[8] = "N/A", ecc[24] = "N/A";
        char fan[8] = "N/A", temp[8] = "N/A", perf[8] = "N/A", pw[16] = "N/A", cap[16] = "N/A";
        char mused[24] = "N/A", mtot[24] = "N/A", util[8] = "N/A", cm[24] = "N/A", mig[16] = "N/A", v[96];
        nvmlEnableState_t e, pend;
        unsigned u;
        if (value(d, K_name, name, sizeof(name)) != V_OK)
            snprintf(name, sizeof(name), "N/A");
        fit(name, narrow ? 18 : 30, 0);
        if (NV(nvmlDeviceGetPersistenceMode, d->h, &e) == NVML_SUCCESS)
            snprintf(pers, sizeof(pers), "%s", e ? "On" : "Off");
        if (value(d, K_pci_bus_id, v, sizeof(v)) == V_OK)
            snprintf(bus, sizeof(bus), "%s", v);
        if (NV(nvmlDeviceGetDisplayActive, d->h, &e) == NVML_SUCCESS)
            snprintf(disp, sizeof(disp), "%s", e ? "On" : "Off");
        else
            snprintf(disp, sizeof(disp), "Off");
        struct mokka_mig_snapshot mv;
        int mig_capable = mig_read(d->index, &mv) == 0 && mv.capable;
        int ecc_on = NV(nvmlDeviceGetEccMode, d->h, &e, &pend) == NVML_SUCCESS && e;
        if (ecc_on && mig_capable && mv.mode)
            snprintf(ecc, sizeof(ecc), "On"); /* MIG mode: the counts are the MIG devices' */
        else if (ecc_on && value(d, K_ecc_errors_uncorrected_volatile_total, v, sizeof(v)) == V_OK)
            snprintf(ecc, sizeof(ecc), "%s", v);
        if (NV(nvmlDeviceGetFanSpeed, d->h, &u) == NVML_SUCCESS)
            snprintf(fan, sizeof(fan), "%u%%", u);
        if (NV(nvmlDeviceGetTemperature, d->h, NVML_TEMPERATURE_GPU, &u) == NVML_SUCCESS)
            snprintf(temp, sizeof(temp), "%uC", u);
        if (value(d, K_pstate, v, sizeof(v)) == V_OK)
            snprintf(perf, sizeof(perf), "%s", v);
        if (NV(nvmlDeviceGetPowerUsage, d->h, &u) == NVML_SUCCESS)
            snprintf(pw, sizeof(pw), "%uW", u / 1000);
        if (NV(nvmlDeviceGetEnforcedPowerLimit, d->h, &u) == NVML_SUCCESS)
            snprintf(cap, sizeof(cap), "%uW", u / 1000);
        if (value(d, K_memory_used, v, sizeof(v)) == V_OK)
            snprintf(mused, sizeof(mused), "%sMiB", v);
        if (value(d, K_memory_total, v, sizeof(v)) == V_OK)
            snprintf(mtot, sizeof(mtot), "%sMiB", v);
        if (mig_capable)
            snprintf(mig, sizeof(mig), "%s", mv.mode ? "Enabled" : "Disabled");
        if (value(d, K_utilization_gpu, v, sizeof(v)) == V_OK) /* N/A in MIG mode */
            snprintf(util, sizeof(util), "%s%%", v);
        if (NV(nvmlDeviceGetComputeMode, d->h, (nvmlComputeMode_t *)&u) == NVML_SUCCESS) {
            static const char *names[] = {"Default", "E. Thread", "Prohibited", "E. Process"};
            snprintf(cm, sizeof(cm), "%s", u < 4 ? names[u] : "Unknown");
        }
        if (wide) {
            printf("|%4u  %-31s%-3s |   %-16s %3s |%21s |\n", d->index, name, pers, bus, disp, ecc);
            printf("|%4s %5s    %-3s%15s / %5s |%11s / %9s |%8s%13s |\n", fan, temp, perf, pw, cap, mused, mtot, util, cm);
            printf("|                                         |                        |%21s |\n", mig);
        } else if (narrow) { /* 470, 525 */
            printf("|%4u  %-18s  %-3s  | %-16s %3s |%21s |\n", d->index, name, pers, bus, disp, ecc);
            printf("|%4s %5s    %-3s%6s / %4s |%10s / %8s |%8s%13s |\n", fan, temp, perf, pw, cap, mused, mtot, util, cm);
            printf("|                               |                      |%21s |\n", mig);
        } else { /* 535 */
            printf("|%4u  %-31s%-3s | %-16s %3s |%21s |\n", d->index, name, pers, bus, disp, ecc);
            printf("|%4s %5s    %-3s%16s / %4s |%10s / %8s |%8s%13s |\n", fan, temp, perf, pw, cap, mused, mtot, util, cm);
            printf("|                                         |                      |%21s |\n", mig);
        }
        printf("%s", fr ? fr->row_rule : "+-----------------------------------------+------------------------+----------------------+\n");
    }
    const char *gap = fr ? fr->gap : g_branch >= 560 ? "\n" : "                                                                                         \n";
    /* Up to 565 the real tool puts an empty line between the GPUs and a MIG table, and the
       branch's gap after it (the 470-550 records). */
    printf("%s", g_branch < 570 && mig_table_any() ? "\n" : gap);
    if (mig_table(rule)) /* between the GPUs and the processes, with a gap of its own */
        printf("%s", gap);
    printf("%s", rule);
    if (fr) {
        printf("%s", fr->procs_head);
    } else {
        printf("| Processes:                                                                              |\n");
        if (g_branch >= 570)
            printf("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n"
                   "|        ID   ID                                                               Usage      |\n");
        else
            printf("|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |\n"
                   "|        ID   ID                                                               Usage      |\n");
        printf("|=========================================================================================|\n");
    }
    int width = fr ? fr->width - 49 : g_branch >= 570 ? 36 : 42; /* the process name's column */
    int any = 0;
    for (unsigned i = 0; i < g_ndevs; i++) {
        struct proc ps[64];
        unsigned np = get_procs(&g_devs[i], ps, 64);
        for (unsigned j = 0; j < np; j++) {
            char name[256], gi[8] = "N/A", ci[8] = "N/A", mem[24] = "N/A";
            proc_name(ps[j].pid, name, sizeof(name));
            if (ps[j].gi != 0xFFFFFFFFu) {
                snprintf(gi, sizeof(gi), "%u", ps[j].gi);
                snprintf(ci, sizeof(ci), "%u", ps[j].ci);
            }
            if (ps[j].mem != (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
                snprintf(mem, sizeof(mem), "%lluMiB", ps[j].mem >> 20);
            if (ps[j].gi != 0xFFFFFFFFu) { /* a MIG process: ids in their own columns (user guide, 580) */
                fit(name, width, 1);
                if (g_branch >= 570)
                    printf("|%5u%5u%5u %16u %6s   %-36s%10s |\n", g_devs[i].index, ps[j].gi, ps[j].ci, ps[j].pid,
                           ps[j].type, name, mem);
                else
                    printf("|%5u%5u%5u %10u %6s   %-*s%10s |\n", g_devs[i].index, ps[j].gi, ps[j].ci, ps[j].pid,
                           ps[j].type, width, name, mem);
            } else if (g_branch >= 570) {
                fit(name, 36, 1);
                printf("|%5u %5s%5s%16u %6s   %-36s%10s |\n", g_devs[i].index, gi, ci, ps[j].pid, ps[j].type, name, mem);
            } else {
                fit(name, width, 1);
                printf("|%5u %5s%5s%10u %6s   %-*s%10s |\n", g_devs[i].index, gi, ci, ps[j].pid, ps[j].type, width,
                       name, mem);
            }
            any = 1;
        }
    }
    if (!any)
        printf("%s", fr ? fr->no_procs : "|  No running processes found                                                             |\n");
    printf("%s", rule);
}

int cmd_table(void)
{
    if (check_handles(1))
        return g_exit;
    table();
    return 0;
}
