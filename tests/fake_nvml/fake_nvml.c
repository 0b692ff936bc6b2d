/*
 * A fake NVML for otel-training's tests: a shared library with the C ABI of libnvidia-ml.so.1
 * (as far as otel_training.device_metrics uses it), loaded by the real `pynvml` binding
 * (nvidia-ml-py), so that the binding's own ctypes code runs and our code converts NVML's
 * native units itself: utilisation in %, memory in bytes, power in mW, energy in mJ since the
 * driver was loaded, temperature in degrees Celsius, clocks in MHz.
 *
 * The test sets devices, values and failures through the fake_nvml_* functions below (from
 * Python with ctypes, on the same loaded library). Every NVML call of a device counts its
 * calls, returns the failure set for it (for the next N calls, or every call), and returns
 * NVML_ERROR_GPU_IS_LOST for every call once the device is lost, as the driver does.
 *
 * Only what the binding needs of the ABI is declared; the numbers are those of nvml.h
 * (return codes, nvmlTemperatureSensors_t, nvmlClockType_t, the structure layouts).
 * Build: gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15,
};

typedef struct {
    unsigned int gpu;    /* percent of the last sample period in which a kernel ran */
    unsigned int memory; /* percent of it in which memory was read or written */
} nvmlUtilization_t;

typedef struct {
    unsigned long long total; /* bytes */
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* The calls a device answers, in the order of CALLS: failures and counts are kept per call. */
enum {
    CALL_HANDLE_BY_INDEX,
    CALL_HANDLE_BY_UUID,
    CALL_UUID,
    CALL_NAME,
    CALL_UTILIZATION,
    CALL_MEMORY,
    CALL_POWER,
    CALL_ENERGY,
    CALL_TEMPERATURE,
    CALL_CLOCK,
    CALL_COUNT
};

static const char *const CALLS[CALL_COUNT] = {
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
};

enum { MAX_DEVICES = 8, TEXT = 96, CLOCK_TYPES = 3 };

struct nvmlDevice_st {
    char uuid[TEXT];
    char name[TEXT];
    unsigned int utilization_gpu_percent;
    unsigned long long memory_total_bytes;
    unsigned long long memory_used_bytes;
    unsigned int power_mw;
    unsigned long long energy_mj;
    unsigned int temperature_c;
    unsigned int clock_mhz[CLOCK_TYPES]; /* graphics, sm, memory: nvmlClockType_t 0, 1, 2 */
    int lost;
    nvmlReturn_t failure[CALL_COUNT];
    int failing_argument[CALL_COUNT]; /* the clock type or sensor that fails; < 0: any */
    long failures_left[CALL_COUNT];   /* < 0: every call fails */
    unsigned long calls[CALL_COUNT];
};
typedef struct nvmlDevice_st *nvmlDevice_t;

static struct nvmlDevice_st devices[MAX_DEVICES];
static unsigned int device_count;
static int initialised;
static nvmlReturn_t init_failure;

/* ---- what the test sets ------------------------------------------------------------- */

void fake_nvml_reset(void)
{
    memset(devices, 0, sizeof devices);
    device_count = 0;
    initialised = 0;
    init_failure = NVML_SUCCESS;
}

int fake_nvml_add_device(const char *uuid, const char *name)
{
    if (device_count == MAX_DEVICES)
        return -1;
    struct nvmlDevice_st *device = &devices[device_count];
    memset(device, 0, sizeof *device);
    for (int call = 0; call < CALL_COUNT; call++)
        device->failing_argument[call] = -1;
    snprintf(device->uuid, TEXT, "%s", uuid);
    snprintf(device->name, TEXT, "%s", name);
    return (int)device_count++;
}

/* Sets one value of device `index` by its name (in NVML's units); returns 0, or -1 for an
 * unknown index or name. */
int fake_nvml_set(unsigned int index, const char *what, unsigned long long value)
{
    if (index >= device_count)
        return -1;
    struct nvmlDevice_st *d = &devices[index];
    if (!strcmp(what, "utilization_gpu_percent"))
        d->utilization_gpu_percent = (unsigned int)value;
    else if (!strcmp(what, "memory_total_bytes"))
        d->memory_total_bytes = value;
    else if (!strcmp(what, "memory_used_bytes"))
        d->memory_used_bytes = value;
    else if (!strcmp(what, "power_mw"))
        d->power_mw = (unsigned int)value;
    else if (!strcmp(what, "energy_mj"))
        d->energy_mj = value;
    else if (!strcmp(what, "temperature_c"))
        d->temperature_c = (unsigned int)value;
    else if (!strcmp(what, "clock_graphics_mhz"))
        d->clock_mhz[0] = (unsigned int)value;
    else if (!strcmp(what, "clock_sm_mhz"))
        d->clock_mhz[1] = (unsigned int)value;
    else if (!strcmp(what, "clock_memory_mhz"))
        d->clock_mhz[2] = (unsigned int)value;
    else
        return -1;
    return 0;
}

static int call_index(const char *call)
{
    for (int i = 0; i < CALL_COUNT; i++)
        if (!strcmp(CALLS[i], call))
            return i;
    return -1;
}

/* Makes `call` of device `index` return `failure`: for the next `times` calls, or for every
 * call when `times` < 0; only for its clock type or sensor `argument` when that is >= 0.
 * Returns 0, or -1 for an unknown index or call. */
int fake_nvml_fail(unsigned int index, const char *call, int argument, nvmlReturn_t failure,
                   long times)
{
    int which = call_index(call);
    if (index >= device_count || which < 0)
        return -1;
    devices[index].failure[which] = failure;
    devices[index].failing_argument[which] = argument;
    devices[index].failures_left[which] = times;
    return 0;
}

/* The device falls off the bus: every later call on it returns NVML_ERROR_GPU_IS_LOST. */
int fake_nvml_lose(unsigned int index)
{
    if (index >= device_count)
        return -1;
    devices[index].lost = 1;
    return 0;
}

/* nvmlInit fails with `failure` (NVML_ERROR_DRIVER_NOT_LOADED, ...). */
void fake_nvml_fail_init(nvmlReturn_t failure) { init_failure = failure; }

/* How many times `call` was made for device `index` (-1 for an unknown index or call). */
long fake_nvml_calls(unsigned int index, const char *call)
{
    int which = call_index(call);
    if (index >= device_count || which < 0)
        return -1;
    return (long)devices[index].calls[which];
}

/* ---- NVML ---------------------------------------------------------------------------- */

/* The outcome of `call` (with its clock type or sensor `argument`, else -1) on `device`
 * before it answers: counted, then lost or failed or not. */
static nvmlReturn_t enter(struct nvmlDevice_st *device, int call, int argument)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device < devices || device >= devices + device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    device->calls[call]++;
    if (device->lost)
        return NVML_ERROR_GPU_IS_LOST;
    int chosen = device->failing_argument[call] < 0 || device->failing_argument[call] == argument;
    if (device->failure[call] != NVML_SUCCESS && chosen && device->failures_left[call] != 0) {
        if (device->failures_left[call] > 0)
            device->failures_left[call]--;
        return device->failure[call];
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    if (init_failure != NVML_SUCCESS)
        return init_failure;
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    return result == NVML_SUCCESS ? "Success" : "Fake NVML error";
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    *count = device_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t outcome = enter(&devices[index], CALL_HANDLE_BY_INDEX, -1);
    if (outcome == NVML_SUCCESS)
        *device = &devices[index];
    return outcome;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; i < device_count; i++) {
        if (strcmp(devices[i].uuid, uuid))
            continue;
        nvmlReturn_t outcome = enter(&devices[i], CALL_HANDLE_BY_UUID, -1);
        if (outcome == NVML_SUCCESS)
            *device = &devices[i];
        return outcome;
    }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t outcome = enter(device, CALL_UUID, -1);
    return outcome != NVML_SUCCESS ? outcome : copy_text(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t outcome = enter(device, CALL_NAME, -1);
    return outcome != NVML_SUCCESS ? outcome : copy_text(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    nvmlReturn_t outcome = enter(device, CALL_UTILIZATION, -1);
    if (outcome == NVML_SUCCESS) {
        utilization->gpu = device->utilization_gpu_percent;
        utilization->memory = 0;
    }
    return outcome;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t outcome = enter(device, CALL_MEMORY, -1);
    if (outcome == NVML_SUCCESS) {
        memory->total = device->memory_total_bytes;
        memory->used = device->memory_used_bytes;
        memory->free = device->memory_total_bytes - device->memory_used_bytes;
    }
    return outcome;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power_mw)
{
    nvmlReturn_t outcome = enter(device, CALL_POWER, -1);
    if (outcome == NVML_SUCCESS)
        *power_mw = device->power_mw;
    return outcome;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy_mj)
{
    nvmlReturn_t outcome = enter(device, CALL_ENERGY, -1);
    if (outcome == NVML_SUCCESS)
        *energy_mj = device->energy_mj;
    return outcome;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *celsius)
{
    nvmlReturn_t outcome = enter(device, CALL_TEMPERATURE, sensor);
    if (outcome == NVML_SUCCESS && sensor != 0) /* NVML_TEMPERATURE_GPU: the die */
        return NVML_ERROR_INVALID_ARGUMENT;
    if (outcome == NVML_SUCCESS)
        *celsius = device->temperature_c;
    return outcome;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz)
{
    nvmlReturn_t outcome = enter(device, CALL_CLOCK, type);
    if (outcome == NVML_SUCCESS && (type < 0 || type >= CLOCK_TYPES))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (outcome == NVML_SUCCESS)
        *mhz = device->clock_mhz[type];
    return outcome;
}
