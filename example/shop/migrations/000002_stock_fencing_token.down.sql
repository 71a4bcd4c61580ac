ALTER TABLE products DROP COLUMN stock_fencing_token;
