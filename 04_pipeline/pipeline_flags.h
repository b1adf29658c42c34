/* pipeline_flags.h: chapter 04's flags: their rows, what they hold, their
 * defaults and the checks of the pp x cp x tp x dp layout, written once for
 * every program that takes them (a train.c lists the row sets it takes:
 * FLAG_ROWS, config.h; a later technique may retell a row, FLAG_RETELL). */
#ifndef PIPELINE_FLAGS_H
#define PIPELINE_FLAGS_H

#include "common/run/config.h" /* Config and the flag tables */
#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */
#include "03_model_parallel/model_parallel.h" /* 03: one model held by a group of ranks */

typedef struct {
    char schedule[16];  /* gpipe, 1f1b, interleaved, zb-h1 */
    int virtual_chunks; /* --virtual: chunks of layers per stage (interleaved) */
    int pp;             /* --pp: pipeline stages, 0 = world / (tp x dp) */
    int print_schedule;
} PipelineFlags;
extern const Flag pipeline_flags[];

/* The layout is pp x cp x tp x dp. --mp tensor is chapter 03's tensor group:
 * one stage, tp = world / dp / cp. Else tp is --tp (default 1); with --pp
 * given, dp is the rest of the world unless --dp says it, and without it pp
 * is. The record holds the numbers, so that layouts written two ways agree. */
void pipeline_effective_flags(const Config *cfg, PipelineFlags *pipe, ModelParallelFlags *model);
/* pipeline_check_world, then pipeline_check_batch. */
void pipeline_check_flags(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model);

/* The world is pp x cp x tp x dp: --mp tensor has one stage, every stage
 * needs a block, tp slices whole heads, cp cuts each sequence into 2 x cp
 * chunks, --sp needs tp and 1F1B or GPipe, and --experts cp 1.
 * Each problem ends the program with one line (EXIT_USAGE). */
void pipeline_check_world(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model);
/* Every replica's share of the batch cut into whole micro-batches; the
 * schedule's own rules (schedule_refusal); --split one number per piece.
 * Every --dp-mode fits a stage (overlap: its buckets launch as the stage's
 * units' gradients become final, Pipeline.unit_final). */
void pipeline_check_batch(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model);

#endif
