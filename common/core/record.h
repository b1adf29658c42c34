/* record.h: a run's identity as (name, value) text items.
 *
 * A run's configuration record (config.h fills it) lists every flag with its
 * value, the identity of every file the run reads and the build. Ranks compare
 * theirs before any collective of training (agreement.h's ranks_agree), a run
 * directory records the one that wrote it (run-info.txt), and a checkpoint's
 * resume is checked against it. Here it is only a list, so the layers that
 * compare or store it need nothing of the command line. */
#ifndef RECORD_H
#define RECORD_H

#include <stdint.h>

/* At most CONFIG_MAX_ITEMS items, each a name and its value as text. */
#define CONFIG_MAX_ITEMS 80
typedef struct {
    char name[32];
    char value[224];
} ConfigItem;
typedef struct {
    int count;
    int flag_items; /* items[0..flag_items) are the flags, the rest the files' identities */
    ConfigItem items[CONFIG_MAX_ITEMS];
} ConfigRecord;
void config_record_add(ConfigRecord *r, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One 64-bit digest of the whole record. */
uint64_t config_record_digest(const ConfigRecord *r);

#endif
