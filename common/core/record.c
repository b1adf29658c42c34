/* record.c: see record.h. */
#include "common/core/record.h" /* the configuration record */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdarg.h>
#include <stdio.h>

void config_record_add(ConfigRecord *r, const char *name, const char *fmt, ...) {
    if (r->count == CONFIG_MAX_ITEMS) fatal(EXIT_RUNTIME, "configuration record full at %s", name);
    ConfigItem *item = &r->items[r->count++];
    snprintf(item->name, sizeof item->name, "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item->value, sizeof item->value, fmt, ap);
    va_end(ap);
}

uint64_t config_record_digest(const ConfigRecord *r) {
    uint64_t h = hash64((uint64_t)r->count);
    for (int i = 0; i < r->count; i++)
        h = hash64(h ^ hash_string(r->items[i].name) ^ hash64(hash_string(r->items[i].value)));
    return h;
}
