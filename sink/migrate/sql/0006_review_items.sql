-- 0006: every review item of a run. review_item is the first item's id; review_items lists
-- them all, in question order (a run with two abstained questions has two). Rows stored
-- before this migration, and records written before replies named every item, have
-- review_items = [review_item] when they went to review (the sink fills it from review_item),
-- else [].
ALTER TABLE {{local "runs"}}{{.OnCluster}}
    ADD COLUMN IF NOT EXISTS review_items Array(String) AFTER review_item;

-- On a cluster the Distributed table takes the new structure.
{{distributed "runs" "cityHash64(run_id)"}};
