-- 0004: views for spend and batches. They read runs FINAL, so their figures are exact.

-- Spend per caller per day. spend_usd sums the priced runs' cost_usd; it is NULL when no run of
-- the group was priced (unpriced runs are never counted as $0: unpriced_runs says how many the
-- sum leaves out). Cache hits cost a real 0.
CREATE OR REPLACE VIEW {{.DB}}.spend_by_caller_day{{.OnCluster}} AS
SELECT
    toDate(finished_at)              AS day,
    caller,
    count()                          AS runs,
    countIf(isNotNull(cost_usd))     AS priced_runs,
    countIf(isNull(cost_usd))        AS unpriced_runs,
    countIf(cache_hit)               AS cache_hits,
    sum(cost_usd)                    AS spend_usd,
    sum(input_tokens)                AS input_tokens,
    sum(output_tokens)               AS output_tokens
FROM {{.DB}}.runs FINAL
GROUP BY day, caller;

-- Spend per provider and model per day, the same way.
CREATE OR REPLACE VIEW {{.DB}}.spend_by_model_day{{.OnCluster}} AS
SELECT
    toDate(finished_at)              AS day,
    provider,
    model,
    count()                          AS runs,
    countIf(isNotNull(cost_usd))     AS priced_runs,
    countIf(isNull(cost_usd))        AS unpriced_runs,
    countIf(cache_hit)               AS cache_hits,
    sum(cost_usd)                    AS spend_usd,
    sum(input_tokens)                AS input_tokens,
    sum(output_tokens)               AS output_tokens
FROM {{.DB}}.runs FINAL
GROUP BY day, provider, model;

-- One row per batch: how far it got and how it went. failed_by_code counts the failed runs by
-- error code. Items not yet finished have no run row: compare runs with the batch's size.
CREATE OR REPLACE VIEW {{.DB}}.batch_progress{{.OnCluster}} AS
SELECT
    caller,
    batch_id,
    count()                                                 AS runs,
    countIf(status = 'success')                             AS succeeded,
    countIf(status = 'failed')                              AS failed,
    sumMapIf(map(error_code, toUInt64(1)), status = 'failed') AS failed_by_code,
    countIf(has(answers.verdict, 'abstained'))              AS runs_with_abstentions,
    countIf(cache_hit)                                      AS cache_hits,
    sum(cost_usd)                                           AS spend_usd,
    countIf(isNull(cost_usd))                               AS unpriced_runs,
    sum(input_tokens)                                       AS input_tokens,
    sum(output_tokens)                                      AS output_tokens,
    min(published_at)                                       AS first_published,
    max(finished_at)                                        AS last_finished
FROM {{.DB}}.runs FINAL
WHERE batch_id != ''
GROUP BY caller, batch_id;

-- A batch's runs counted by status and error code ('' on success).
CREATE OR REPLACE VIEW {{.DB}}.batch_outcomes{{.OnCluster}} AS
SELECT
    caller,
    batch_id,
    status,
    error_code,
    count()            AS runs,
    max(finished_at)   AS last_finished
FROM {{.DB}}.runs FINAL
WHERE batch_id != ''
GROUP BY caller, batch_id, status, error_code;
