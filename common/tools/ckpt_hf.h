/* ckpt_hf.h: common/ckpt's Hugging Face side. The course's GPT is GPT-2, so a
 * checkpoint is a transformers GPT2LMHeadModel under other names and, for the
 * blocks' four matrices, in the transposed layout of GPT-2's Conv1D. */
#ifndef CKPT_HF_H
#define CKPT_HF_H

/* common/ckpt export PATH DIR --format hf: DIR/model.safetensors and
 * DIR/config.json, which GPT2LMHeadModel.from_pretrained(DIR) loads. DIR is a
 * new directory (its parent exists) or one holding only an earlier such
 * export (recognised by content). */
void hf_export(const char *path, const char *dir);

/* common/ckpt import-hf DIR OUT: a GPT-2 in Hugging Face's layout
 * (DIR/config.json, DIR/model.safetensors; F32, F16 or BF16) as a course
 * checkpoint at step 0, Adam's moments zero: every chapter and layout
 * resumes it as a fresh run from those weights. OUT is a new name or an
 * earlier checkpoint. Refuses, in one line, what the course's GPT cannot
 * represent. */
void hf_import(const char *dir, const char *out);

#endif
