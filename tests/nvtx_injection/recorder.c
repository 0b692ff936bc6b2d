/*
 * A minimal NVTX v3 injection library for otel-training's tests.
 *
 * NVTX v3 is header-only: the first NVTX call in each module that embeds it reads
 * NVTX_INJECTION64_PATH, dlopen()s that library and calls its InitializeInjectionNvtx2 with a
 * function that hands out export tables. From the CALLBACKS table we get, per API module, an
 * array of pointers to the module's function-pointer slots, and we point the slots we care
 * about at our own functions. Every call is then appended as one JSON object per line to the
 * file named by NVTX_RECORDER_OUTPUT (flushed per line, so nothing is lost if the process
 * dies): range starts and ends with their message, domain, category, colour and the OS thread.
 *
 * With NVTX_RECORDER_MODE=buffer it records as a profiler does instead (Nsight Systems keeps
 * events in memory while the process runs): each call stores its operation, thread, range id,
 * message pointer, category and a CLOCK_MONOTONIC timestamp in a preallocated ring of 2^20
 * events, with no I/O, and at exit one line {"op": "summary", "events": N} goes to the output.
 * The benchmarks use it to measure what a range costs under such a tool.
 *
 * Only the parts of the ABI that the recorder needs are declared here; the numbers are those
 * of the NVTX v3 injection interface (export table 1 = callbacks; module 1 = core API, module 5
 * = domain API; callback ids as listed below). Build: gcc -shared -fPIC -o librec.so recorder.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

/* ---- the injection ABI, as far as we use it ---------------------------------------- */

typedef void (*generic_fn)(void);
typedef generic_fn **function_table; /* array of pointers to function-pointer slots */
typedef const void *(*get_export_table_fn)(uint32_t table_id);

struct callbacks_export_table {
    size_t struct_size;
    int (*get_module_function_table)(int module, function_table *out_table,
                                     unsigned int *out_size);
};

enum { EXPORT_TABLE_CALLBACKS = 1 };
enum { MODULE_CORE = 1, MODULE_DOMAIN = 5 };

/* core API (no domain argument: the default domain) */
enum {
    CORE_MARK_EX = 1,
    CORE_RANGE_START_EX = 4,
    CORE_RANGE_START_A = 5,
    CORE_RANGE_END = 7,
    CORE_RANGE_PUSH_EX = 8,
    CORE_RANGE_PUSH_A = 9,
    CORE_RANGE_POP = 11,
    CORE_NAME_CATEGORY_A = 12,
};

/* domain API */
enum {
    DOMAIN_MARK_EX = 1,
    DOMAIN_RANGE_START_EX = 2,
    DOMAIN_RANGE_END = 3,
    DOMAIN_RANGE_PUSH_EX = 4,
    DOMAIN_RANGE_POP = 5,
    DOMAIN_NAME_CATEGORY_A = 8,
    DOMAIN_REGISTER_STRING_A = 10,
    DOMAIN_CREATE_A = 12,
    DOMAIN_DESTROY = 14,
};

enum { MESSAGE_ASCII = 1, MESSAGE_UNICODE = 2, MESSAGE_REGISTERED = 3 };

/* The event-attributes structure, version 2 (48 bytes on LP64). */
struct event_attributes {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    uint64_t payload;
    int32_t message_type;
    const void *message; /* char*, wchar_t* or a registered-string handle */
};

/* Our handles: a domain handle points at a domain_record, a string handle at a copy of the
 * string (NVTX treats both as opaque pointers). */
struct domain_record {
    char name[256];
};

/* ---- recording ------------------------------------------------------------------- */

static FILE *out_file;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static uint64_t next_range_id;

/* NVTX_RECORDER_MODE=buffer: events kept in memory, as a profiler keeps them. */
struct buffered_event {
    const char *op;
    long tid;
    long long range_id;
    uint64_t time_ns;
    const void *message;
    uint32_t category;
};
#define BUFFER_EVENTS (1u << 20)
static int buffer_mode;
static struct buffered_event *events;
static uint64_t event_count;
static __thread long cached_tid;

static void open_output(void) {
    const char *path = getenv("NVTX_RECORDER_OUTPUT");
    const char *mode = getenv("NVTX_RECORDER_MODE");
    out_file = fopen(path && *path ? path : "/dev/stderr", "a");
    if (mode && strcmp(mode, "buffer") == 0) {
        events = calloc(BUFFER_EVENTS, sizeof *events);
        buffer_mode = events != NULL;
    }
}

static long thread_id(void) { return (long)syscall(SYS_gettid); }

static void buffer_event(const char *op, const struct event_attributes *attributes,
                         long long range_id) {
    struct timespec now;
    uint64_t i = __atomic_fetch_add(&event_count, 1, __ATOMIC_RELAXED);
    struct buffered_event *event = &events[i & (BUFFER_EVENTS - 1)];
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!cached_tid) cached_tid = thread_id();
    event->op = op;
    event->tid = cached_tid;
    event->range_id = range_id;
    event->time_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    event->message = attributes ? attributes->message : NULL;
    event->category = attributes ? attributes->category : 0;
}

__attribute__((destructor)) static void write_summary(void) {
    if (!buffer_mode || !out_file) return;
    fprintf(out_file, "{\"op\": \"summary\", \"events\": %llu}\n",
            (unsigned long long)__atomic_load_n(&event_count, __ATOMIC_RELAXED));
    fflush(out_file);
}

static void json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; ++p) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
            fputc(*p, f);
        } else if (*p < 0x20) {
            fprintf(f, "\\u%04x", *p);
        } else {
            fputc(*p, f);
        }
    }
    fputc('"', f);
}

static const char *domain_name(const void *domain) {
    return domain ? ((const struct domain_record *)domain)->name : "NVTX";
}

static const char *message_text(const struct event_attributes *attributes, char *buffer,
                                size_t size) {
    if (!attributes || !attributes->message) return "";
    switch (attributes->message_type) {
    case MESSAGE_ASCII:
    case MESSAGE_REGISTERED:
        return (const char *)attributes->message;
    case MESSAGE_UNICODE:
        wcstombs(buffer, (const wchar_t *)attributes->message, size - 1);
        buffer[size - 1] = 0;
        return buffer;
    default:
        return "";
    }
}

/* One line: {"op": op, "domain": d, "tid": t, ...extra}. */
static void record(const char *op, const void *domain, const struct event_attributes *attributes,
                   long long range_id, const char *name, long long category) {
    char buffer[1024];
    pthread_once(&open_once, open_output);
    if (buffer_mode) {
        buffer_event(op, attributes, range_id);
        return;
    }
    if (!out_file) return;
    pthread_mutex_lock(&out_lock);
    fprintf(out_file, "{\"op\": \"%s\", \"domain\": ", op);
    json_string(out_file, domain_name(domain));
    fprintf(out_file, ", \"tid\": %ld, \"pid\": %ld", thread_id(), (long)getpid());
    if (range_id >= 0) fprintf(out_file, ", \"id\": %lld", range_id);
    if (attributes) {
        fprintf(out_file, ", \"message\": ");
        json_string(out_file, message_text(attributes, buffer, sizeof buffer));
        fprintf(out_file, ", \"category\": %u, \"color\": %u", attributes->category,
                attributes->color);
    }
    if (name) {
        fprintf(out_file, ", \"name\": ");
        json_string(out_file, name);
    }
    if (category >= 0) fprintf(out_file, ", \"category\": %lld", category);
    fputs("}\n", out_file);
    fflush(out_file);
    pthread_mutex_unlock(&out_lock);
}

/* ---- the domain API -------------------------------------------------------------- */

static void *domain_create_a(const char *name) {
    struct domain_record *domain = calloc(1, sizeof *domain);
    if (!domain) return NULL;
    strncpy(domain->name, name ? name : "", sizeof domain->name - 1);
    record("domain_create", domain, NULL, -1, NULL, -1);
    return domain;
}

static void domain_destroy(void *domain) {
    /* Keep the record: late calls with a destroyed handle must still resolve a name. */
    (void)domain;
}

static const void *domain_register_string_a(void *domain, const char *text) {
    (void)domain;
    return strdup(text ? text : "");
}

static void domain_name_category_a(void *domain, uint32_t category, const char *name) {
    record("category", domain, NULL, -1, name, category);
}

static uint64_t domain_range_start_ex(void *domain, const struct event_attributes *attributes) {
    uint64_t id = __atomic_add_fetch(&next_range_id, 1, __ATOMIC_SEQ_CST);
    record("start", domain, attributes, (long long)id, NULL, -1);
    return id;
}

static void domain_range_end(void *domain, uint64_t id) {
    record("end", domain, NULL, (long long)id, NULL, -1);
}

static int domain_range_push_ex(void *domain, const struct event_attributes *attributes) {
    record("push", domain, attributes, -1, NULL, -1);
    return 0;
}

static int domain_range_pop(void *domain) {
    record("pop", domain, NULL, -1, NULL, -1);
    return 0;
}

static void domain_mark_ex(void *domain, const struct event_attributes *attributes) {
    record("mark", domain, attributes, -1, NULL, -1);
}

/* ---- the core API (default domain) ------------------------------------------------ */

static uint64_t core_range_start_ex(const struct event_attributes *attributes) {
    return domain_range_start_ex(NULL, attributes);
}

static uint64_t core_range_start_a(const char *message) {
    struct event_attributes attributes = {0};
    attributes.message_type = MESSAGE_ASCII;
    attributes.message = message;
    return domain_range_start_ex(NULL, &attributes);
}

static void core_range_end(uint64_t id) { domain_range_end(NULL, id); }

static int core_range_push_ex(const struct event_attributes *attributes) {
    return domain_range_push_ex(NULL, attributes);
}

static int core_range_push_a(const char *message) {
    struct event_attributes attributes = {0};
    attributes.message_type = MESSAGE_ASCII;
    attributes.message = message;
    return domain_range_push_ex(NULL, &attributes);
}

static int core_range_pop(void) { return domain_range_pop(NULL); }

static void core_mark_ex(const struct event_attributes *attributes) {
    domain_mark_ex(NULL, attributes);
}

static void core_name_category_a(uint32_t category, const char *name) {
    domain_name_category_a(NULL, category, name);
}

/* ---- initialisation ------------------------------------------------------------------ */

static void assign(function_table table, unsigned int size, unsigned int id, generic_fn fn) {
    if (table && id <= size && table[id]) *table[id] = fn;
}

/* Called once by every module of the process that embeds NVTX (the nvtx Python package has
 * several), each with its own tables. Returns 1 (success). */
int InitializeInjectionNvtx2(get_export_table_fn get_export_table) {
    const struct callbacks_export_table *callbacks =
        (const struct callbacks_export_table *)get_export_table(EXPORT_TABLE_CALLBACKS);
    function_table table = NULL;
    unsigned int size = 0;
    if (!callbacks || !callbacks->get_module_function_table) return 0;

    if (callbacks->get_module_function_table(MODULE_CORE, &table, &size)) {
        assign(table, size, CORE_MARK_EX, (generic_fn)core_mark_ex);
        assign(table, size, CORE_RANGE_START_EX, (generic_fn)core_range_start_ex);
        assign(table, size, CORE_RANGE_START_A, (generic_fn)core_range_start_a);
        assign(table, size, CORE_RANGE_END, (generic_fn)core_range_end);
        assign(table, size, CORE_RANGE_PUSH_EX, (generic_fn)core_range_push_ex);
        assign(table, size, CORE_RANGE_PUSH_A, (generic_fn)core_range_push_a);
        assign(table, size, CORE_RANGE_POP, (generic_fn)core_range_pop);
        assign(table, size, CORE_NAME_CATEGORY_A, (generic_fn)core_name_category_a);
    }
    table = NULL;
    size = 0;
    if (callbacks->get_module_function_table(MODULE_DOMAIN, &table, &size)) {
        assign(table, size, DOMAIN_MARK_EX, (generic_fn)domain_mark_ex);
        assign(table, size, DOMAIN_RANGE_START_EX, (generic_fn)domain_range_start_ex);
        assign(table, size, DOMAIN_RANGE_END, (generic_fn)domain_range_end);
        assign(table, size, DOMAIN_RANGE_PUSH_EX, (generic_fn)domain_range_push_ex);
        assign(table, size, DOMAIN_RANGE_POP, (generic_fn)domain_range_pop);
        assign(table, size, DOMAIN_NAME_CATEGORY_A, (generic_fn)domain_name_category_a);
        assign(table, size, DOMAIN_REGISTER_STRING_A, (generic_fn)domain_register_string_a);
        assign(table, size, DOMAIN_CREATE_A, (generic_fn)domain_create_a);
        assign(table, size, DOMAIN_DESTROY, (generic_fn)domain_destroy);
    }
    record("init", NULL, NULL, -1, NULL, -1);
    return 1;
}
