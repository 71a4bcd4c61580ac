DROP TABLE products;
DROP TABLE orders;
