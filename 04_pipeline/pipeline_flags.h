/* pipeline_flags.h: what chapter 04's flags hold and the layout checks
 * that chapter 05, which is chapter 04 plus ZeRO, shares with it.
 *
 * The rows of --help stay in each chapter's train.c (05 describes --pp's
 * default and --print-schedule differently, because with one stage it is
 * ZeRO over the whole world); the struct they fill and the checks of the
 * pp x cp x tp x dp layout are written here once. */
#ifndef PIPELINE_FLAGS_H
#define PIPELINE_FLAGS_H

#include "config.h"
#include "data_parallel.h"
#include "model_parallel.h"

typedef struct {
    char schedule[16];  /* gpipe, 1f1b, interleaved, zb-h1 */
    int virtual_chunks; /* --virtual: chunks of layers per stage (interleaved) */
    int pp;             /* --pp: pipeline stages, 0 = world / (tp x dp) */
    int print_schedule;
} PipelineFlags;

/* The world is pp x cp x tp x dp: --mp tensor has one stage, every stage
 * needs a block, tp slices whole heads, cp cuts each sequence into 2 x cp
 * chunks, and --sp needs tp and 1F1B or GPipe. Each problem ends the
 * program with one line (EXIT_USAGE). */
void pipeline_check_world(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model);
/* Every replica's share of the batch cut into whole micro-batches; the
 * schedule's own rules (schedule_refusal); --split one number per piece.
 * Every --dp-mode fits a stage (overlap: its buckets launch as the stage's
 * units' gradients become final, Pipeline.unit_final). */
void pipeline_check_batch(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model);

#endif
