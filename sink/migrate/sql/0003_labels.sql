-- 0003: labels (the truth about an answer, from reviewers and producers) and the view that
-- joins each with the answer it labels, which `sys1 calibrate` reads.

-- One row per checked label (sys1.labels.<caller>.accepted). Under FINAL only the latest label
-- of a run's question is left: the one accepted last (accepted_at is the time the checked
-- label reached SYS1_LABELS, stamped by the NATS server, never a time the submitter chose).
-- No partitions: a relabel months later must still replace the first label.
CREATE TABLE IF NOT EXISTS {{local "labels"}}{{.OnCluster}}
(
    run_id        String,
    question      String,
    -- the run's verified caller
    caller        LowCardinality(String),
    -- the label as text: the option key (choice), 'true'/'false' (noul), the level index in
    -- decimal (score); value is the same as JSON
    label         String,
    value         String,
    reviewer      LowCardinality(String),
    -- review (the review page) or producer (ground truth from the producer)
    source        LowCardinality(String),
    -- the review item it answers (source review)
    item          String,
    labelled_at   DateTime64(3, 'UTC'),
    accepted_at   DateTime64(6, 'UTC'),
    labels_stream LowCardinality(String),
    labels_seq    UInt64,
    inserted_at   DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = {{engine "ReplacingMergeTree(accepted_at)"}}
ORDER BY (run_id, question)
TTL toDateTime(accepted_at) + INTERVAL {{.RetentionDays}} DAY
{{settings}};

-- Labels shard like runs (by run id), so a run and its labels live on the same shard.
{{distributed "labels" "cityHash64(run_id)"}};

-- The dead-letter table also parks what the label sink cannot store: kind is run (a run record
-- the sink cannot store), label (an accepted label it cannot store) or rejected_label (a
-- submitted label the workers refused, with their reason in error).
ALTER TABLE {{local "runs_dead_letter"}}{{.OnCluster}}
    ADD COLUMN IF NOT EXISTS kind LowCardinality(String) DEFAULT 'run' AFTER received_at;

{{distributed "runs_dead_letter" "cityHash64(runs_stream, runs_seq)"}};

-- One row per labelled question (its latest label) with the answer it labels. predicted is
-- what the answer said: the chosen option (choice), 'true' when P(yes) ≥ 0.5 (noul), the most
-- probable level's index (score, the lowest on a tie); correct is predicted = label.
-- prob_keys/prob_values are the answer's raw distribution in order (noul: ['false', 'true'],
-- [1 − P(yes), P(yes)]; score: by level index), label_probability the probability the answer
-- gave the label. The columns `sys1 calibrate` reads have exactly the types it reads them as
-- (plain String, not LowCardinality). GLOBAL: on a cluster the labels are read once and sent
-- to every shard.
CREATE OR REPLACE VIEW {{.DB}}.labelled_answers{{.OnCluster}} AS
SELECT
    r.run_id                       AS run_id,
    CAST(r.caller AS String)       AS caller,
    CAST(r.provider AS String)     AS provider,
    CAST(r.model AS String)        AS model,
    CAST(r.question AS String)     AS question,
    CAST(r.type AS String)         AS type,
    r.finished_at                  AS finished_at,
    l.labelled_at                  AS labelled_at,
    r.predicted                    AS predicted,
    l.label                        AS label,
    toUInt8(r.predicted = l.label) AS correct,
    r.confidence                   AS confidence,
    toFloat64(arrayElement(r.prob_values, indexOf(r.prob_keys, l.label))) AS label_probability,
    r.prob_keys                    AS prob_keys,
    r.prob_values                  AS prob_values,
    CAST(l.reviewer AS String)     AS reviewer,
    CAST(l.source AS String)       AS source,
    l.item                         AS item,
    l.accepted_at       AS accepted_at,
    r.verdict           AS verdict,
    r.rule              AS rule,
    r.calibrated_probability AS calibrated_probability,
    r.temperature       AS temperature,
    r.batch_id          AS batch_id
FROM
(
    SELECT run_id, question, label, reviewer, source, item, labelled_at, accepted_at
    FROM {{.DB}}.labels FINAL
) AS l
GLOBAL INNER JOIN
(
    SELECT
        run_id, caller, provider, model, finished_at, batch_id,
        answers.name                   AS question,
        answers.type                   AS type,
        answers.confidence             AS confidence,
        answers.verdict                AS verdict,
        answers.rule                   AS rule,
        answers.calibrated_probability AS calibrated_probability,
        answers.temperature            AS temperature,
        multiIf(answers.type = 'noul', ['false', 'true'],
                answers.type = 'score', arraySort(k -> toUInt32OrZero(k), mapKeys(answers.probabilities)),
                mapKeys(answers.probabilities)) AS prob_keys,
        multiIf(answers.type = 'noul', [1 - ifNull(answers.noul, 0), ifNull(answers.noul, 0)],
                answers.type = 'score', arraySort((v, k) -> toUInt32OrZero(k), mapValues(answers.probabilities), mapKeys(answers.probabilities)),
                mapValues(answers.probabilities)) AS prob_values,
        multiIf(answers.type = 'choice', toString(answers.choice),
                answers.type = 'noul', if(ifNull(answers.noul, 0) >= 0.5, 'true', 'false'),
                empty(prob_values), toString(toUInt32(round(ifNull(answers.score, 0)))),
                prob_keys[indexOf(prob_values, arrayMax(prob_values))]) AS predicted
    FROM {{.DB}}.runs FINAL
    ARRAY JOIN answers
    WHERE run_id GLOBAL IN (SELECT run_id FROM {{.DB}}.labels)
) AS r
ON r.run_id = l.run_id AND r.question = l.question;
