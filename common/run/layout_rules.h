/* layout_rules.h: refusals of a layout that the programs and the planner
 * (common/plan) both apply, written once. The planner sits below the
 * chapters (it may not link their modules), so the rules it must state
 * exactly as the programs do live here, and the chapters call them too.
 *
 * Each returns NULL when the layout is fine, else the one line the program
 * ends with (fatal, EXIT_USAGE) and the planner prints or lists; the text is
 * in a static buffer, valid until the next call. */
#ifndef LAYOUT_RULES_H
#define LAYOUT_RULES_H

#include "common/run/config.h" /* Config and the flag tables */

/* Tensor parallelism over tp ranks (03's --mp tensor, 04-06's --tp): every
 * rank holds whole attention heads, a slice of the MLP's 4 x dmodel
 * columns and an equal share of the vocabulary's rows (wte and the head),
 * so tp divides --heads, 4 x --dmodel and vocab_padded(--vocab). */
const char *tensor_parallel_problem(const ModelConfig *cfg, int tp);

/* What ZeRO does not combine with, for --zero `zero` on P stages of T tensor
 * ranks (chapters 05 and 06): chapter 04's replica flags under ZeRO or on one
 * stage (ZeRO keeps the replicas), --virtual with ZeRO, --schedule on one
 * stage, --prefetch below stage 3, --print-schedule below it on one stage, and
 * stage 3 with stages or tensor slices. Which flags were typed: flag_given. */
const char *zero_flags_problem(const Config *cfg, int zero, int P, int T, int print_schedule);

#endif
