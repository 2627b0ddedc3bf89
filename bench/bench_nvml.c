/* NVML shim numbers: ns per getter call, control-file write -> nvmlEventSetWait
   return, write -> a polling reader sees the new temperature, nvmlInit_v2 + nvmlShutdown.
   Usage: bench_nvml MOUNTPOINT   (MOKKA_STATE and LD_LIBRARY_PATH point at the node). */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"

#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* percentiles in us */
static void report(const char *what, double *v, int n)
{
    report_percentiles(what, 44, v, n, 1e3, "us", 1);
}

static void control_write(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, text, strlen(text)) < 0) {
        perror(path);
        exit(1);
    }
    close(fd);
}

#define CALLS 2000000
#define TRIALS 1000

static nvmlDevice_t dev;
static nvmlEventSet_t set;
static sem_t ready, done;
static double t_woke[TRIALS];

static void *waiter(void *arg)
{
    (void)arg;
    nvmlEventData_t d;
    for (int i = 0; i < TRIALS; i++) {
        sem_post(&ready);
        while (nvmlEventSetWait_v2(set, &d, 5000) != NVML_SUCCESS)
            ;
        t_woke[i] = now_ns();
        sem_post(&done);
    }
    return NULL;
}

static unsigned poll_want = 1; /* 0: stop */
static double t_seen;

static void *poller(void *arg)
{
    (void)arg;
    struct timespec nap = {0, 20000};
    for (int i = 0; i < TRIALS; i++) {
        sem_post(&ready);
        unsigned got = 0, want;
        while ((want = __atomic_load_n(&poll_want, __ATOMIC_SEQ_CST)) == 1)
            nanosleep(&nap, NULL); /* the writer has not set this trial's value yet */
        for (;;) {
            want = __atomic_load_n(&poll_want, __ATOMIC_SEQ_CST);
            if (want == 0)
                return NULL;
            if (nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &got) == NVML_SUCCESS && got == want)
                break;
            nanosleep(&nap, NULL);
        }
        t_seen = now_ns();
        __atomic_store_n(&poll_want, 1u, __ATOMIC_SEQ_CST);
        sem_post(&done);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s MOUNTPOINT\n", argv[0]);
        return 2;
    }
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &dev) != NVML_SUCCESS) {
        fprintf(stderr, "nvmlInit_v2 failed: is MOKKA_STATE set?\n");
        return 1;
    }
    unsigned u;
    nvmlMemory_t mem;
    nvmlDevice_t h;
    double t0;
#define PER_CALL(name, expr)                                              \
    t0 = now_ns();                                                        \
    for (int i = 0; i < CALLS; i++)                                       \
        expr;                                                             \
    printf("%-44s %8.1f ns/call\n", name, (now_ns() - t0) / CALLS);
    PER_CALL("nvmlDeviceGetTemperature", nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &u));
    PER_CALL("nvmlDeviceGetMemoryInfo", nvmlDeviceGetMemoryInfo(dev, &mem));
    PER_CALL("nvmlDeviceGetPowerUsage", nvmlDeviceGetPowerUsage(dev, &u));
    PER_CALL("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex_v2(0, &h));

    char xid[512], temp[512];
    snprintf(xid, sizeof(xid), "%s/gpu0/inject_xid", argv[1]);
    snprintf(temp, sizeof(temp), "%s/gpu0/temperature", argv[1]);
    static double lat[TRIALS];

    nvmlEventSetCreate(&set);
    nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError, set);
    sem_init(&ready, 0, 0);
    sem_init(&done, 0, 0);
    pthread_t th;
    pthread_create(&th, NULL, waiter, NULL);
    for (int i = 0; i < TRIALS; i++) {
        sem_wait(&ready);
        usleep(200); /* let the waiter reach FUTEX_WAIT */
        double t = now_ns();
        control_write(xid, "13\n");
        sem_wait(&done);
        lat[i] = t_woke[i] - t;
    }
    pthread_join(th, NULL);
    report("write inject_xid -> nvmlEventSetWait_v2", lat, TRIALS);

    /* A reader polling in its own thread (every 20 us, as a monitoring loop would, rather than
       spinning a core away from the daemon) notes when it first sees each new value; the clock
       starts just before the writer opens the control file. */
    pthread_t poll_th;
    pthread_create(&poll_th, NULL, poller, NULL);
    for (int i = 0; i < TRIALS; i++) {
        unsigned want = 40 + i % 2;
        char text[16];
        snprintf(text, sizeof(text), "%u\n", want);
        sem_wait(&ready);
        __atomic_store_n(&poll_want, want, __ATOMIC_SEQ_CST);
        double t = now_ns();
        control_write(temp, text);
        sem_wait(&done);
        lat[i] = t_seen - t;
    }
    __atomic_store_n(&poll_want, 0u, __ATOMIC_SEQ_CST);
    sem_post(&ready);
    pthread_join(poll_th, NULL);
    control_write(temp, "auto\n");
    report("write temperature -> polling reader sees it", lat, TRIALS);

    nvmlShutdown();
    for (int i = 0; i < TRIALS; i++) {
        double t = now_ns();
        nvmlInit_v2();
        nvmlShutdown();
        lat[i] = now_ns() - t;
    }
    report("nvmlInit_v2 + nvmlShutdown", lat, TRIALS);
    return 0;
}
