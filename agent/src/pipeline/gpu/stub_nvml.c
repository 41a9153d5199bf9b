/* A stub of NVIDIA's management library (libnvidia-ml.so.1) for the
 * tests: the entry points nvml.rs resolves, with nvml.h's signatures and
 * struct layouts (NVML 13.3.29, as vendored by NVIDIA/go-nvml at
 * gen/nvml/nvml.h), and no driver behind them.
 *
 * Built with `cc -shared -fPIC`; what it does is set by -D at build time
 * (unit tests, which share one process) or by the environment at run time
 * (the agent started by an integration test):
 *   GPUS / STUB_NVML_GPUS  GPUs it has (default 1)
 *   STUB_NVML_UTIL  each GPU's utilisation in %, comma-separated by index
 *                   ("10,90"; default 90 for any GPU not named)
 *   INIT_RETURN     nvmlInit_v2's return (default 0, NVML_SUCCESS)
 *   FAIL_HANDLE     the handle whose utilisation read fails (default none)
 *   NO_GPM          leave the GPM entry points out (a driver before 12.0)
 *   STUB_NVML_INIT_SLEEP_MS / INIT_SLEEP_MS  nvmlInit_v2 takes this many
 *                   ms (a node without the persistence daemon)
 *   STUB_NVML_INIT_MARK      a file nvmlInit_v2 creates as it starts
 *   STUB_NVML_GPM / GPM_GPUS how many GPUs (the first ones) say they
 *                   support GPM (default all)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef GPUS
#define GPUS 1
#endif
#ifndef INIT_RETURN
#define INIT_RETURN 0
#endif
#ifndef FAIL_HANDLE
#define FAIL_HANDLE 0
#endif
#ifndef GPM_GPUS
#define GPM_GPUS GPUS
#endif
#ifndef INIT_SLEEP_MS
#define INIT_SLEEP_MS 0
#endif

typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;

static long env_or(const char *name, long fallback) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : fallback;
}

int nvmlInit_v2(void) {
    const char *mark = getenv("STUB_NVML_INIT_MARK");
    if (mark && *mark) {
        FILE *f = fopen(mark, "w");
        if (f) fclose(f);
    }
    long ms = env_or("STUB_NVML_INIT_SLEEP_MS", INIT_SLEEP_MS);
    if (ms > 0) {
        struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
        nanosleep(&t, NULL);
    }
    return INIT_RETURN;
}
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 3 ? "Not Supported" : r == 9 ? "Driver Not Loaded" : "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = (unsigned int)env_or("STUB_NVML_GPUS", GPUS); return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { *d = (void *)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetUUID(void *d, char *u, unsigned int len) { snprintf(u, len, "GPU-stub-%lu", (unsigned long)d); return 0; }
int nvmlDeviceGetUtilizationRates(void *d, nvmlUtilization_t *u) {
    if ((unsigned long)d == FAIL_HANDLE) return 3;
    unsigned int gpu = 90;
    const char *v = getenv("STUB_NVML_UTIL");
    for (unsigned long i = 1; v && *v; i++) {
        char *end;
        long pct = strtol(v, &end, 10);
        if (i == (unsigned long)d && end != v) gpu = (unsigned int)pct;
        v = *end == ',' ? end + 1 : NULL;
    }
    u->gpu = gpu; u->memory = 40; return 0;
}
int nvmlDeviceGetMemoryInfo(void *d, nvmlMemory_t *m) {
    m->total = 80ULL << 30; m->used = 4ULL << 30; m->free = m->total - m->used; return 0;
}

#ifndef NO_GPM
/* The stub plays a driver whose NVML_GPM_METRIC_MAX is 98 (12.0 to 12.8):
 * it refuses more metrics than that, and writes only the numMetrics asked. */
#define STUB_GPM_METRIC_MAX 98
#define NVML_GPM_METRIC_SM_UTIL 2
#define NVML_GPM_METRIC_SM_OCCUPANCY 3

typedef struct { unsigned int version; unsigned int isSupportedDevice; } nvmlGpmSupport_t;
struct nvmlGpmSample_st { unsigned long device; unsigned long taken; };
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;
typedef struct {
    unsigned int metricId;
    int nvmlReturn;
    double value;
    struct { char *shortName; char *longName; char *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[STUB_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

static unsigned long samples_taken;

int nvmlGpmQueryDeviceSupport(void *d, nvmlGpmSupport_t *s) {
    if (s->version != 1) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    s->isSupportedDevice = (long)(unsigned long)d <= env_or("STUB_NVML_GPM", GPM_GPUS);
    return 0;
}
int nvmlGpmSampleAlloc(nvmlGpmSample_t *s) {
    *s = calloc(1, sizeof(struct nvmlGpmSample_st));
    return *s ? 0 : 2;
}
int nvmlGpmSampleFree(nvmlGpmSample_t s) { free(s); return 0; }
int nvmlGpmSampleGet(void *d, nvmlGpmSample_t s) {
    if (!s) return 2;
    s->device = (unsigned long)d;
    s->taken = ++samples_taken;
    return 0;
}
/* SM activity 37.5 %, occupancy 12.5 %, between two samples of one GPU. */
int nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    if (m->version != 1) return 25;
    if (m->numMetrics == 0 || m->numMetrics > STUB_GPM_METRIC_MAX) return 2;
    if (!m->sample1 || !m->sample2 || m->sample1 == m->sample2) return 2;
    if (m->sample1->device != m->sample2->device || m->sample1->taken >= m->sample2->taken) return 2;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        x->nvmlReturn = 0;
        x->metricInfo.shortName = x->metricInfo.longName = x->metricInfo.unit = NULL;
        if (x->metricId == NVML_GPM_METRIC_SM_UTIL) x->value = 37.5;
        else if (x->metricId == NVML_GPM_METRIC_SM_OCCUPANCY) x->value = 12.5;
        else x->nvmlReturn = 3;
    }
    return 0;
}
#endif
