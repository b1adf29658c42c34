/* plan_machine.c: see plan_machine.h. */
#include "common/tools/plan_machine.h" /* machine files */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Each number's key, place and valid range: wide enough for any machine from one slow CPU core
 * (a loaded one, measured by --calibrate --quick) to a rack's accelerator, and narrow enough
 * that every formula of plan_time.h stays a finite, positive time. */
static const struct {
    const char *key;
    size_t field; /* offset of its double in Machine */
    double min, max;
    const char *unit;
} machine_keys[] = {
    {"flops", offsetof(Machine, flops), 1e6, 1e18, "FLOP/s"},
    {"alpha_s", offsetof(Machine, alpha_s), 1e-9, 1, "seconds"},
    {"beta_bytes_per_s", offsetof(Machine, beta_bytes_per_s), 1e3, 1e14, "bytes/s"},
    {"h2d_bytes_per_s", offsetof(Machine, h2d_bytes_per_s), 1e3, 1e14, "bytes/s"},
    {"d2h_bytes_per_s", offsetof(Machine, d2h_bytes_per_s), 1e3, 1e14, "bytes/s"},
    {"cpu_adam_params_per_s", offsetof(Machine, cpu_adam_params_per_s), 1e3, 1e14, "parameters/s"},
    {"device_adam_params_per_s", offsetof(Machine, device_adam_params_per_s), 1e3, 1e14, "parameters/s"},
    {"device_mem_bytes", offsetof(Machine, device_mem_bytes), 1e6, 1e15, "bytes"},
    {"overlap", offsetof(Machine, overlap), 0, 1, "a fraction"},
};
enum { MACHINE_NUMBERS = sizeof machine_keys / sizeof machine_keys[0] };

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

/* The number of key k on line `number`, or the refusal naming its valid range. */
static double machine_number(const char *path, int number, int k, const char *value) {
    char *end;
    errno = 0;
    double x = strtod(value, &end);
    if (!*value || *end || errno || !isfinite(x) || x < machine_keys[k].min || x > machine_keys[k].max)
        fatal(EXIT_USAGE,
              "--machine %s:%d: %s = '%s' is not a number from %g to %g (valid: %s in that range)", path,
              number, machine_keys[k].key, value, machine_keys[k].min, machine_keys[k].max,
              machine_keys[k].unit);
    return x;
}

/* A machine file is a few hundred bytes of text; more than this is not one (and is not read whole). */
enum { MACHINE_FILE_MAX_BYTES = 1 << 20 };

/* Is the file at path something to read as text at all? Ends the program when it is a directory, a
 * device or FIFO (which could block), or far too large to be a machine file. */
static void machine_check_file(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "--machine %s: cannot read it (%s)", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fatal(EXIT_USAGE, "--machine %s: is a directory (valid: a machine file)", path);
    if (!S_ISREG(st.st_mode))
        fatal(EXIT_USAGE, "--machine %s: not a regular file (valid: a machine file)", path);
    if (st.st_size > MACHINE_FILE_MAX_BYTES)
        fatal(EXIT_USAGE, "--machine %s: %lld bytes (valid: a machine file, a few hundred bytes of text)", path,
              (long long)st.st_size);
}

/* The first byte of line[0..length) that a text line does not hold (a control character other than a
 * tab or a carriage return, NUL included), or -1: a binary file is named, never echoed. */
static int machine_line_binary_byte(const char *line, size_t length) {
    for (size_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') || c == 0x7f) return c;
    }
    return -1;
}

void machine_read(const char *path, Machine *m) {
    machine_check_file(path);
    FILE *f = fopen(path, "r");
    if (!f) fatal(EXIT_USAGE, "--machine %s: cannot read it (%s)", path, strerror(errno));
    *m = (Machine){0};
    int seen[MACHINE_NUMBERS + 1] = {0}; /* the numbers, then name */
    char *line = NULL; /* any length: a comment may be long */
    size_t capacity = 0;
    ssize_t length;
    for (int number = 1; (length = getline(&line, &capacity, f)) >= 0; number++) {
        int binary = machine_line_binary_byte(line, (size_t)length);
        if (binary >= 0)
            fatal(EXIT_USAGE,
                  "--machine %s:%d: a binary byte 0x%02x, not text (valid: a machine file of 'key = value' "
                  "lines)",
                  path, number, binary);
        /* a UTF-8 byte order mark, which some editors write first, is not part of the text */
        if (number == 1 && strncmp(line, "\xef\xbb\xbf", 3) == 0) memmove(line, line + 3, (size_t)length - 2);
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *text = trim(line);
        if (!*text) continue;
        char *eq = strchr(text, '=');
        if (!eq) fatal(EXIT_USAGE, "--machine %s:%d: expected 'key = value', got '%s'", path, number, text);
        *eq = 0;
        char *key = trim(text), *value = trim(eq + 1);
        int k = 0;
        while (k < MACHINE_NUMBERS && strcmp(key, machine_keys[k].key) != 0) k++;
        if (k == MACHINE_NUMBERS && strcmp(key, "name") != 0) {
            char valid[512] = "name"; /* the keys, from the table */
            for (int j = 0; j < MACHINE_NUMBERS; j++)
                snprintf(valid + strlen(valid), sizeof valid - strlen(valid), ", %s", machine_keys[j].key);
            fatal(EXIT_USAGE, "--machine %s:%d: unknown key '%s' (valid: %s)", path, number, key, valid);
        }
        if (seen[k]++) fatal(EXIT_USAGE, "--machine %s:%d: '%s' given twice", path, number, key);
        if (k == MACHINE_NUMBERS) {
            if (!*value || strlen(value) >= sizeof m->name || strpbrk(value, " \t,"))
                fatal(EXIT_USAGE, "--machine %s:%d: name '%s' is not one word of 1..%zu characters", path,
                      number, value, sizeof m->name - 1);
            strcpy(m->name, value);
            continue;
        }
        *(double *)((char *)m + machine_keys[k].field) = machine_number(path, number, k, value);
    }
    free(line);
    fclose(f);
    if (!seen[MACHINE_NUMBERS]) fatal(EXIT_USAGE, "--machine %s: no 'name = ...' line", path);
    for (int k = 0; k < MACHINE_NUMBERS; k++)
        if (!seen[k]) fatal(EXIT_USAGE, "--machine %s: no '%s = ...' line", path, machine_keys[k].key);
}
