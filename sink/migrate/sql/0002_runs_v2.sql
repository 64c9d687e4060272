-- 0002: run records of schema version 2. Batches (batch_id, item_id), what a run cost
-- (cost_usd, NULL when unpriced: never a fake 0), the exact result cache (cache_hit), traces
-- (trace_id), human review (review_status, review_item), the abstention policy's verdict and
-- the calibration applied to each answer, and the model each attempt sent.
--
-- Rows stored before this migration read the new columns as their defaults: '' and false,
-- NULL for cost and calibration, and for the nested answers/attempts columns arrays of the
-- same length as their siblings, so ARRAY JOIN keeps working across old and new rows.
ALTER TABLE {{local "runs"}}{{.OnCluster}}
    ADD COLUMN IF NOT EXISTS batch_id String AFTER subject,
    ADD COLUMN IF NOT EXISTS item_id String AFTER batch_id,
    -- attempts.model[i] is the model sent to attempts.provider[i] ('' when nothing was sent).
    ADD COLUMN IF NOT EXISTS attempts.model Array(LowCardinality(String)) AFTER attempts.provider,
    -- answers.verdict[i] is decided | abstained | reviewed ('' without a policy), under the
    -- policy rule answers.rule[i]. answers.calibrated_probability[i] is the calibrated top
    -- probability: a choice's calibrated probability of the chosen option, a score's of its
    -- most probable level, a noul's calibrated P(yes); NULL, like answers.temperature[i],
    -- when no fit applied.
    ADD COLUMN IF NOT EXISTS answers.verdict Array(LowCardinality(String)) AFTER answers.probabilities,
    ADD COLUMN IF NOT EXISTS answers.rule Array(LowCardinality(String)) AFTER answers.verdict,
    ADD COLUMN IF NOT EXISTS answers.calibrated_probability Array(Nullable(Float64)) AFTER answers.rule,
    ADD COLUMN IF NOT EXISTS answers.temperature Array(Nullable(Float64)) AFTER answers.calibrated_probability,
    -- the verdicts as the reply carried them (JSON, '' without a policy): reasons, calibrated
    -- distributions, reviewers' labels
    ADD COLUMN IF NOT EXISTS verdicts String CODEC(ZSTD(3)) AFTER result,
    ADD COLUMN IF NOT EXISTS review_status LowCardinality(String) AFTER verdicts,
    ADD COLUMN IF NOT EXISTS review_item String AFTER review_status,
    ADD COLUMN IF NOT EXISTS cache_hit Bool AFTER review_item,
    ADD COLUMN IF NOT EXISTS cost_usd Nullable(Float64) AFTER cache_hit,
    ADD COLUMN IF NOT EXISTS trace_id String AFTER schema_version;

-- A batch's runs and a trace's run are found without reading every run.
ALTER TABLE {{local "runs"}}{{.OnCluster}}
    ADD INDEX IF NOT EXISTS runs_batch_id batch_id TYPE bloom_filter GRANULARITY 4,
    ADD INDEX IF NOT EXISTS runs_trace_id trace_id TYPE bloom_filter GRANULARITY 4;

-- On a cluster the Distributed table takes the new structure.
{{distributed "runs" "cityHash64(run_id)"}};
