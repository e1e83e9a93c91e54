/* A scripted libnvidia-ml for the GPU monitor tests, loaded through GT_NVML_LIBRARY (never linked).
 *
 * Every value is read from the environment at each call; a list separated by ',' gives one value per GPU
 * (the last one repeats for the GPUs after it).
 *   FAKE_NVML_FAIL_INIT=1       nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED
 *   FAKE_NVML_GPUS=2            device count (default 1)
 *   FAKE_NVML_PCI=a,b           PCI bus ids of the devices, for nvmlDeviceGetHandleByPciBusId_v2
 *   FAKE_NVML_UTIL, FAKE_NVML_MEM_USED_MIB, FAKE_NVML_MEM_TOTAL_MIB, FAKE_NVML_TEMP, FAKE_NVML_POWER_W,
 *   FAKE_NVML_POWER_LIMIT_W, FAKE_NVML_SM_CLOCK     the readings
 *   FAKE_NVML_THROTTLE          reasons joined by '+': idle, power_cap, hw_slowdown, sw_thermal, hw_thermal,
 *                               thermal (= sw_thermal+hw_thermal), power_brake, none; or a number (0x28)
 *   FAKE_NVML_UNSUPPORTED=power that reading answers NVML_ERROR_NOT_SUPPORTED (power, temp, util)
 *   FAKE_NVML_SLOW_MS=300       nvmlDeviceGetUtilizationRates takes that long, as on a busy or hung driver
 * fake_nvml_count("init" | "shutdown" | "util") says how often those were called, for the tests. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void* nvmlDevice_t;
typedef struct {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;
typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

enum { OK = 0, NOT_INITIALISED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, DRIVER_NOT_LOADED = 9 };
enum { MAX_GPUS = 16 };

static int g_devices[MAX_GPUS];
static int g_init_depth = 0;
static int g_count_init = 0, g_count_shutdown = 0, g_count_util = 0;

int fake_nvml_count(const char* what) {
  if (strcmp(what, "init") == 0) return g_count_init;
  if (strcmp(what, "shutdown") == 0) return g_count_shutdown;
  if (strcmp(what, "util") == 0) return g_count_util;
  return -1;
}

/* The `index`-th ','-separated item of $var copied into out (the last item when there are fewer). */
static int item(const char* var, int index, char* out, size_t size) {
  const char* s = getenv(var);
  if (!s || !*s) return 0;
  for (int i = 0; i < index; ++i) {
    const char* comma = strchr(s, ',');
    if (!comma) break;
    s = comma + 1;
  }
  size_t n = strcspn(s, ",");
  if (n >= size) n = size - 1;
  memcpy(out, s, n);
  out[n] = 0;
  return 1;
}

static double number(const char* var, int index, double fallback) {
  char buf[64];
  return item(var, index, buf, sizeof buf) ? strtod(buf, NULL) : fallback;
}

static int gpu_count(void) {
  int n = (int)number("FAKE_NVML_GPUS", 0, 1);
  return n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : n);
}

static int unsupported(const char* what) {
  const char* s = getenv("FAKE_NVML_UNSUPPORTED");
  return s && strstr(s, what) != NULL;
}

/* Which device a handle is, or -1. */
static int which(nvmlDevice_t d) {
  for (int i = 0; i < MAX_GPUS; ++i)
    if (d == (nvmlDevice_t)&g_devices[i]) return i < gpu_count() ? i : -1;
  return -1;
}

#define DEVICE_OR_FAIL(d, i)                     \
  if (g_init_depth <= 0) return NOT_INITIALISED; \
  const int i = which(d);                        \
  if (i < 0) return INVALID_ARGUMENT

nvmlReturn_t nvmlInit_v2(void) {
  ++g_count_init;
  const char* fail = getenv("FAKE_NVML_FAIL_INIT");
  if (fail && strcmp(fail, "1") == 0) return DRIVER_NOT_LOADED;
  ++g_init_depth;
  return OK;
}

nvmlReturn_t nvmlShutdown(void) {
  ++g_count_shutdown;
  if (g_init_depth <= 0) return NOT_INITIALISED;
  --g_init_depth;
  return OK;
}

const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case OK: return "Success";
    case NOT_INITIALISED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (g_init_depth <= 0) return NOT_INITIALISED;
  *count = (unsigned int)gpu_count();
  return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (g_init_depth <= 0) return NOT_INITIALISED;
  if ((int)index >= gpu_count()) return INVALID_ARGUMENT;
  *device = (nvmlDevice_t)&g_devices[index];
  return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvmlDevice_t* device) {
  if (g_init_depth <= 0) return NOT_INITIALISED;
  char buf[64];
  for (int i = 0; i < gpu_count(); ++i)
    if (item("FAKE_NVML_PCI", i, buf, sizeof buf) && strcmp(buf, bus_id) == 0) {
      *device = (nvmlDevice_t)&g_devices[i];
      return OK;
    }
  return NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  DEVICE_OR_FAIL(d, i);
  ++g_count_util;
  const double slow_ms = number("FAKE_NVML_SLOW_MS", 0, 0);
  if (slow_ms > 0) {
    struct timespec ts = {(time_t)(slow_ms / 1000), (long)((slow_ms - 1000.0 * (time_t)(slow_ms / 1000)) * 1e6)};
    nanosleep(&ts, NULL);
  }
  if (unsupported("util")) return NOT_SUPPORTED;
  u->gpu = (unsigned int)number("FAKE_NVML_UTIL", i, 0);
  u->memory = 0;
  return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  DEVICE_OR_FAIL(d, i);
  const double mib = 1024.0 * 1024.0;
  m->total = (unsigned long long)(number("FAKE_NVML_MEM_TOTAL_MIB", i, 81920) * mib);
  m->used = (unsigned long long)(number("FAKE_NVML_MEM_USED_MIB", i, 0) * mib);
  m->free = m->total > m->used ? m->total - m->used : 0;
  return OK;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int* temp) {
  DEVICE_OR_FAIL(d, i);
  if (sensor != 0) return INVALID_ARGUMENT;
  if (unsupported("temp")) return NOT_SUPPORTED;
  *temp = (unsigned int)number("FAKE_NVML_TEMP", i, 40);
  return OK;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int* mw) {
  DEVICE_OR_FAIL(d, i);
  if (unsupported("power")) return NOT_SUPPORTED;
  *mw = (unsigned int)(number("FAKE_NVML_POWER_W", i, 100) * 1000.0);
  return OK;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int* mw) {
  DEVICE_OR_FAIL(d, i);
  if (unsupported("power")) return NOT_SUPPORTED;
  *mw = (unsigned int)(number("FAKE_NVML_POWER_LIMIT_W", i, 700) * 1000.0);
  return OK;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int* mhz) {
  DEVICE_OR_FAIL(d, i);
  if (type != 1) return INVALID_ARGUMENT; /* the monitor asks for NVML_CLOCK_SM only */
  *mhz = (unsigned int)number("FAKE_NVML_SM_CLOCK", i, 1980);
  return OK;
}

static unsigned long long reason_bits(const char* name) {
  if (strcmp(name, "idle") == 0) return 0x1;
  if (strcmp(name, "power_cap") == 0) return 0x4;
  if (strcmp(name, "hw_slowdown") == 0) return 0x8;
  if (strcmp(name, "sw_thermal") == 0) return 0x20;
  if (strcmp(name, "hw_thermal") == 0) return 0x40;
  if (strcmp(name, "thermal") == 0) return 0x20 | 0x40;
  if (strcmp(name, "power_brake") == 0) return 0x80;
  return strtoull(name, NULL, 0); /* "none" and numbers */
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long* reasons) {
  DEVICE_OR_FAIL(d, i);
  char buf[128];
  *reasons = 0;
  if (!item("FAKE_NVML_THROTTLE", i, buf, sizeof buf)) return OK;
  char* save = NULL;
  for (char* tok = strtok_r(buf, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) *reasons |= reason_bits(tok);
  return OK;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long* reasons) {
  return nvmlDeviceGetCurrentClocksEventReasons(d, reasons);
}
