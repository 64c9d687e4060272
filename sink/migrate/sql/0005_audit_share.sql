-- 0005: the audit share of every decided answer (run records of schema version 3 carry it in
-- verdicts[].audit_share), so that sys1 calibrate can weigh audit labels by the inverse of
-- their chance of being drawn and estimate the error of the traffic without bias.

-- answers.audit_share[i] is answer i's audit share (the audit_sample of the rule that decided
-- it), 0 when it abstained, its rule samples nothing, or its record predates schema version 3.
-- Rows stored before this migration read it as 0, an array as long as their other answers
-- columns, so ARRAY JOIN keeps working across old and new rows.
ALTER TABLE {{local "runs"}}{{.OnCluster}}
    ADD COLUMN IF NOT EXISTS answers.audit_share Array(Float64) AFTER answers.temperature;

-- On a cluster the Distributed table takes the new structure.
{{distributed "runs" "cityHash64(run_id)"}};

-- labelled_answers again, with audit_share: the chance a decided answer had of being sampled
-- for review (0 on abstained answers, on rules that sample nothing, and on runs recorded
-- before this migration, whose share is unknown); sys1 calibrate weighs an audit label by its
-- inverse. verdict is now plain String, like the other columns sys1 calibrate reads.
-- Otherwise as in 0003: one row per labelled question (its latest label) with the answer it
-- labels. predicted is what the answer said: the chosen option (choice), 'true' when
-- P(yes) ≥ 0.5 (noul), the most probable level's index (score, the lowest on a tie); correct
-- is predicted = label.
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
    CAST(r.verdict AS String) AS verdict,
    r.rule              AS rule,
    r.calibrated_probability AS calibrated_probability,
    r.temperature       AS temperature,
    r.batch_id          AS batch_id,
    r.audit_share       AS audit_share
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
        answers.audit_share            AS audit_share,
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
