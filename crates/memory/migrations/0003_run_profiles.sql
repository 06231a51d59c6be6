-- Which provider and auth profile answered a run (the model is already recorded).
ALTER TABLE runs ADD COLUMN provider text;
ALTER TABLE runs ADD COLUMN profile text;
