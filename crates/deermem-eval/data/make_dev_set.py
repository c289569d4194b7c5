#!/usr/bin/env python3
"""Writes dev.jsonl, the retrieval development set, from the hand-written facts and queries
below, and checks the labelling rules: a paraphrase query shares no word (English) and no
character bigram (Chinese) with any of its relevant facts; a lexical query shares at least one;
a crosslingual query is in the other language than each of its relevant facts.

Run: python3 crates/deermem-eval/data/make_dev_set.py  (rewrites dev.jsonl beside this file)
"""
import json, os, re, sys

# Each user: (language, facts, queries). A query is (kind, text, [indices of relevant facts]).
USERS = {}

USERS["maya"] = ("en", [
    "Prefers oolong tea over coffee in the morning",                        # 0
    "Works as a backend engineer at a robotics startup",                    # 1
    "Lives in Lisbon with her partner",                                     # 2
    "Allergic to peanuts",                                                  # 3
    "Writes most of her services in Rust",                                  # 4
    "Runs a half marathon every spring",                                    # 5
    "Has a cat named Pixel",                                                # 6
    "Speaks Portuguese at an intermediate level",                           # 7
    "Wants code reviews to be short and direct",                            # 8
    "Uses Neovim as her editor",                                            # 9
    "Is vegetarian",                                                        # 10
    "Her team deploys to Kubernetes on Fridays",                            # 11
    "Studied physics at university",                                        # 12
    "Plays the cello in an amateur orchestra",                              # 13
    "Is planning a trip to Japan in October",                               # 14
    "Dislikes long meetings",                                               # 15
    "Reads science fiction before bed",                                     # 16
    "Her manager is called Ricardo",                                        # 17
    "Commutes by bicycle",                                                  # 18
    "Is learning to bake sourdough bread",                                  # 19
    "Keeps her notes in plain Markdown files",                              # 20
    "Birthday is on 14 March",                                              # 21
    "Prefers dark mode in every application",                               # 22
    "Volunteers at an animal shelter on Sundays",                           # 23
    "Is saving money to buy an apartment",                                  # 24
    "Her sister lives in Toronto",                                          # 25
    "Gets migraines when she sleeps too little",                            # 26
    "Likes answers with code examples",                                     # 27
    "Has been on call this week",                                           # 28
    "Grew up in a small town near Porto",                                   # 29
], [
    ("lexical", "oolong tea", [0]),
    ("lexical", "robotics startup job", [1]),
    ("lexical", "peanuts allergy", [3]),
    ("lexical", "Rust services", [4]),
    ("lexical", "cat name", [6]),
    ("lexical", "Neovim editor", [9]),
    ("lexical", "Kubernetes deploys", [11]),
    ("lexical", "cello orchestra", [13]),
    ("lexical", "sourdough", [19]),
    ("lexical", "sister Toronto", [25]),
    ("paraphrase", "what does she drink when she wakes up", [0]),
    ("paraphrase", "where does she work", [1]),
    ("paraphrase", "which city is home", [2]),
    ("paraphrase", "food she cannot eat because of a reaction", [3]),
    ("paraphrase", "pet", [6]),
    ("paraphrase", "does she eat meat", [10]),
    ("paraphrase", "musical instrument", [13]),
    ("paraphrase", "upcoming holiday abroad", [14]),
    ("paraphrase", "how does she get to the office", [18]),
    ("paraphrase", "headaches", [26]),
])

USERS["tom"] = ("en", [
    "Teaches history at a high school in Chicago",                          # 0
    "Has two daughters, aged 7 and 10",                                     # 1
    "Drinks black coffee all day",                                          # 2
    "Coaches the school chess club",                                        # 3
    "Is a lifelong Cubs fan",                                               # 4
    "Drives a 2012 Honda Civic",                                            # 5
    "Is writing a book about the Civil War",                                # 6
    "Has type 2 diabetes",                                                  # 7
    "Prefers printed worksheets over slides",                               # 8
    "Grades papers on Sunday evenings",                                     # 9
    "His wife Laura is a nurse",                                            # 10
    "Goes fishing at Lake Michigan in summer",                              # 11
    "Uses Google Classroom with his students",                              # 12
    "Wants lesson plans for ninth graders",                                 # 13
    "Is bad with spreadsheets",                                             # 14
    "Collects vinyl records of jazz",                                       # 15
    "Plays poker with friends on Thursdays",                                # 16
    "His father served in Vietnam",                                         # 17
    "Is trying to lose weight by walking",                                  # 18
    "Hates cold weather",                                                   # 19
    "Owns a golden retriever called Max",                                   # 20
    "Learned Spanish in college",                                           # 21
    "Prefers email over phone calls",                                       # 22
    "Takes the train downtown on weekends",                                 # 23
    "Is the union representative at his school",                            # 24
    "Watches documentaries about ancient Rome",                             # 25
    "Grows tomatoes in his backyard",                                       # 26
    "Had knee surgery last year",                                           # 27
    "Volunteers as a referee for youth soccer",                             # 28
    "Reads the newspaper every morning",                                    # 29
], [
    ("lexical", "history teacher Chicago", [0]),
    ("lexical", "daughters", [1]),
    ("lexical", "chess club", [3]),
    ("lexical", "Honda Civic", [5]),
    ("lexical", "Civil War book", [6]),
    ("lexical", "diabetes", [7]),
    ("lexical", "jazz vinyl", [15]),
    ("lexical", "golden retriever", [20]),
    ("lexical", "tomatoes backyard", [26]),
    ("lexical", "knee surgery", [27]),
    ("paraphrase", "what is his profession", [0]),
    ("paraphrase", "how many kids", [1]),
    ("paraphrase", "baseball team he supports", [4]),
    ("paraphrase", "what car", [5]),
    ("paraphrase", "medical condition with blood sugar", [7]),
    ("paraphrase", "spouse occupation", [10]),
    ("paraphrase", "card game night", [16]),
    ("paraphrase", "his dog", [20]),
    ("paraphrase", "languages besides English", [21]),
    ("paraphrase", "gardening", [26]),
])

USERS["priya"] = ("en", [
    "Is a pediatrician at a children's hospital in London",                 # 0
    "Works night shifts twice a week",                                      # 1
    "Practises yoga every morning",                                         # 2
    "Is lactose intolerant",                                                # 3
    "Moved to the UK from Bangalore in 2015",                               # 4
    "Her husband Arjun is an architect",                                    # 5
    "Is studying for a public health master's degree",                      # 6
    "Wants summaries of medical papers in plain language",                  # 7
    "Plays badminton on Saturdays",                                         # 8
    "Listens to podcasts about economics",                                  # 9
    "Prefers metric units",                                                 # 10
    "Is afraid of flying",                                                  # 11
    "Cooks South Indian food at weekends",                                  # 12
    "Has a son starting primary school",                                    # 13
    "Uses an iPhone and a MacBook",                                         # 14
    "Wants to run for the hospital board",                                  # 15
    "Her mother lives with them",                                           # 16
    "Takes vitamin D supplements",                                          # 17
    "Enjoys watercolour painting",                                          # 18
    "Supports Arsenal",                                                     # 19
    "Rents a flat in Islington",                                            # 20
    "Speaks Kannada, Hindi and English",                                    # 21
    "Is on a waiting list for an allotment",                                # 22
    "Finds spreadsheets relaxing",                                          # 23
    "Dislikes horror films",                                                # 24
    "Drives an electric Nissan Leaf",                                       # 25
    "Is training for a charity cycle ride",                                 # 26
    "Drinks masala chai in the afternoon",                                  # 27
    "Keeps a journal of gratitude",                                         # 28
    "Her best friend Meera lives in Leeds",                                 # 29
], [
    ("lexical", "pediatrician hospital", [0]),
    ("lexical", "night shifts", [1]),
    ("lexical", "yoga", [2]),
    ("lexical", "lactose", [3]),
    ("lexical", "public health degree", [6]),
    ("lexical", "badminton", [8]),
    ("lexical", "economics podcasts", [9]),
    ("lexical", "watercolour", [18]),
    ("lexical", "Nissan Leaf", [25]),
    ("lexical", "masala chai", [27]),
    ("paraphrase", "what kind of doctor", [0]),
    ("paraphrase", "dairy problems", [3]),
    ("paraphrase", "where was she born", [4]),
    ("paraphrase", "spouse", [5]),
    ("paraphrase", "scared on aeroplanes", [11]),
    ("paraphrase", "football club", [19]),
    ("paraphrase", "her neighbourhood", [20]),
    ("paraphrase", "what car", [25]),
    ("paraphrase", "movies she avoids", [24]),
    ("paraphrase", "children", [13]),
])

USERS["lars"] = ("en", [
    "Is a jazz pianist who tours Europe",                                   # 0
    "Lives in Copenhagen",                                                  # 1
    "Practises scales for two hours daily",                                 # 2
    "Has tinnitus in his left ear",                                         # 3
    "Records albums in a studio he built at home",                          # 4
    "Prefers Steinway pianos",                                              # 5
    "Teaches harmony online",                                               # 6
    "Is gluten free",                                                       # 7
    "Uses Logic Pro for mixing",                                            # 8
    "His band is called North Light Trio",                                  # 9
    "Swims in the harbour in winter",                                       # 10
    "Wants help writing grant applications",                                # 11
    "Collects old Danish furniture",                                        # 12
    "Sleeps late and works at night",                                       # 13
    "Has a daughter named Freja",                                           # 14
    "Is divorced",                                                          # 15
    "Drinks aquavit at Christmas",                                          # 16
    "Learned to play on his grandmother's organ",                           # 17
    "Admires Bill Evans",                                                   # 18
    "Rides a cargo bike",                                                   # 19
    "Is composing a suite about the sea",                                   # 20
    "Dislikes social media",                                                # 21
    "Speaks Danish, English and German",                                    # 22
    "Played at the Montreux festival in 2019",                              # 23
    "Reads poetry by Inger Christensen",                                    # 24
    "Has a recording contract with a Berlin label",                         # 25
    "Fixes his own synthesizers",                                           # 26
    "Prefers vinyl releases over streaming",                                # 27
    "Runs a small jazz club on Mondays",                                    # 28
    "Is anxious before large concerts",                                     # 29
], [
    ("lexical", "jazz pianist tours", [0]),
    ("lexical", "tinnitus", [3]),
    ("lexical", "home studio albums", [4]),
    ("lexical", "Steinway", [5]),
    ("lexical", "gluten", [7]),
    ("lexical", "Logic Pro mixing", [8]),
    ("lexical", "North Light Trio band", [9]),
    ("lexical", "grant applications", [11]),
    ("lexical", "Bill Evans", [18]),
    ("lexical", "Montreux festival", [23]),
    ("paraphrase", "what does he do for work", [0]),
    ("paraphrase", "which city", [1]),
    ("paraphrase", "hearing problem", [3]),
    ("paraphrase", "wheat diet", [7]),
    ("paraphrase", "his child", [14]),
    ("paraphrase", "marital status", [15]),
    ("paraphrase", "favourite musician", [18]),
    ("paraphrase", "how he gets around town", [19]),
    ("paraphrase", "stage fright", [29]),
    ("paraphrase", "languages", [22]),
])

USERS["aisha"] = ("en", [
    "Is a second year computer science student in Nairobi",                 # 0
    "Wants explanations with diagrams",                                     # 1
    "Struggles with linear algebra",                                        # 2
    "Works part time at a phone repair shop",                               # 3
    "Is Muslim and fasts during Ramadan",                                   # 4
    "Plays basketball for her university team",                             # 5
    "Codes mostly in Python",                                               # 6
    "Has an internship interview next month",                               # 7
    "Lives in a hostel on campus",                                          # 8
    "Her younger brother is called Yusuf",                                  # 9
    "Speaks Swahili and English",                                           # 10
    "Uses a secondhand ThinkPad with Ubuntu",                               # 11
    "Wants to specialise in machine learning",                              # 12
    "Dislikes group projects",                                              # 13
    "Listens to Afrobeats while studying",                                  # 14
    "Is saving for a trip to Zanzibar",                                     # 15
    "Has asthma",                                                           # 16
    "Studies best early in the morning",                                    # 17
    "Her favourite author is Chimamanda Ngozi Adichie",                     # 18
    "Mentors high school girls in coding",                                  # 19
    "Drinks a lot of mango juice",                                          # 20
    "Has a scholarship that requires a B average",                          # 21
    "Takes the matatu to town",                                             # 22
    "Is learning French on Duolingo",                                       # 23
    "Prefers short answers during exams week",                              # 24
    "Her mother runs a tailoring business",                                 # 25
    "Is building a mobile app for farmers",                                 # 26
    "Wears glasses",                                                        # 27
    "Is vice president of the robotics society",                            # 28
    "Gets nervous speaking in public",                                      # 29
], [
    ("lexical", "computer science student", [0]),
    ("lexical", "linear algebra", [2]),
    ("lexical", "phone repair shop", [3]),
    ("lexical", "basketball team", [5]),
    ("lexical", "Python", [6]),
    ("lexical", "internship interview", [7]),
    ("lexical", "ThinkPad Ubuntu", [11]),
    ("lexical", "Afrobeats", [14]),
    ("lexical", "scholarship average", [21]),
    ("lexical", "French Duolingo", [23]),
    ("paraphrase", "what does she study", [0]),
    ("paraphrase", "which subject is hard for her", [2]),
    ("paraphrase", "her job", [3]),
    ("paraphrase", "religion", [4]),
    ("paraphrase", "sport", [5]),
    ("paraphrase", "sibling", [9]),
    ("paraphrase", "breathing condition", [16]),
    ("paraphrase", "which novelist does she love", [18]),
    ("paraphrase", "how does she travel downtown", [22]),
    ("paraphrase", "stage fright", [29]),
])

USERS["ben"] = ("en", [
    "Is a retired airline pilot",                                           # 0
    "Flew Boeing 747s for thirty years",                                    # 1
    "Lives in a bungalow in Devon",                                         # 2
    "Has high blood pressure",                                              # 3
    "Plays golf on Tuesdays",                                               # 4
    "Builds model aircraft",                                                # 5
    "His wife Margaret passed away in 2020",                                # 6
    "Has four grandchildren",                                               # 7
    "Finds smartphones confusing",                                          # 8
    "Wants large text and simple steps",                                    # 9
    "Reads military history",                                               # 10
    "Keeps bees in his garden",                                             # 11
    "Drinks a pint of bitter at the local pub on Fridays",                  # 12
    "Walks his spaniel Rosie twice a day",                                  # 13
    "Is hard of hearing",                                                   # 14
    "Does the crossword every morning",                                     # 15
    "Sings in the church choir",                                            # 16
    "Has a pacemaker",                                                      # 17
    "Travels to Spain every winter",                                        # 18
    "Volunteers at the aviation museum",                                    # 19
    "His son Peter is a dentist",                                           # 20
    "Prefers tea with milk and two sugars",                                 # 21
    "Dislikes modern music",                                                # 22
    "Still holds a private pilot licence",                                  # 23
    "Watches cricket on television",                                        # 24
    "Is writing his memoirs",                                               # 25
    "Suffers from arthritis in his hands",                                  # 26
    "Fought in the Falklands",                                              # 27
    "Drives a Land Rover",                                                  # 28
    "Enjoys fish and chips on the seafront",                                # 29
], [
    ("lexical", "retired pilot", [0]),
    ("lexical", "Boeing 747", [1]),
    ("lexical", "blood pressure", [3]),
    ("lexical", "golf", [4]),
    ("lexical", "model aircraft", [5]),
    ("lexical", "bees garden", [11]),
    ("lexical", "spaniel", [13]),
    ("lexical", "crossword", [15]),
    ("lexical", "pacemaker", [17]),
    ("lexical", "Land Rover", [28]),
    ("paraphrase", "what was his career", [0]),
    ("paraphrase", "where is home", [2]),
    ("paraphrase", "is he married", [6]),
    ("paraphrase", "how many grandkids", [7]),
    ("paraphrase", "honey", [11]),
    ("paraphrase", "pet", [13]),
    ("paraphrase", "deaf", [14]),
    ("paraphrase", "heart device", [17]),
    ("paraphrase", "how does he take his cuppa", [21]),
    ("paraphrase", "joint pain", [26]),
])

USERS["sofia"] = ("en", [
    "Is head chef at an Italian restaurant in Melbourne",                   # 0
    "Grew up in Naples",                                                    # 1
    "Works until midnight most days",                                       # 2
    "Is allergic to shellfish",                                             # 3
    "Makes fresh pasta by hand",                                            # 4
    "Wants to open her own trattoria",                                      # 5
    "Has a tattoo of a lemon tree",                                         # 6
    "Surfs at Torquay on her day off",                                      # 7
    "Prefers wine from Campania",                                           # 8
    "Her partner Jess is a graphic designer",                               # 9
    "Has a sourdough starter older than ten years",                         # 10
    "Is teaching her nephew to cook",                                       # 11
    "Keeps her recipes in a spreadsheet",                                   # 12
    "Dislikes fusion cuisine",                                              # 13
    "Is studying for a business management diploma",                        # 14
    "Burned her right hand last month",                                     # 15
    "Speaks Italian and English",                                           # 16
    "Rents a small house in Brunswick",                                     # 17
    "Watches old Fellini films",                                            # 18
    "Her restaurant has sixty seats",                                       # 19
    "Sources tomatoes from a farm in Gippsland",                            # 20
    "Drinks espresso after every service",                                  # 21
    "Has a Vespa",                                                          # 22
    "Is training two apprentices",                                          # 23
    "Suffers from back pain",                                               # 24
    "Wants menu descriptions in a warm tone",                               # 25
    "Goes to the Queen Victoria Market on Tuesdays",                        # 26
    "Her grandmother taught her to make ragù",                              # 27
    "Is vegan one day a week",                                              # 28
    "Won a regional cooking award in 2022",                                 # 29
], [
    ("lexical", "head chef Italian restaurant", [0]),
    ("lexical", "Naples", [1]),
    ("lexical", "shellfish", [3]),
    ("lexical", "fresh pasta", [4]),
    ("lexical", "trattoria", [5]),
    ("lexical", "Torquay surf", [7]),
    ("lexical", "business management diploma", [14]),
    ("lexical", "Fellini", [18]),
    ("lexical", "Vespa", [22]),
    ("lexical", "cooking award", [29]),
    ("paraphrase", "what does she do for work", [0]),
    ("paraphrase", "hometown", [1]),
    ("paraphrase", "seafood reaction", [3]),
    ("paraphrase", "dream business plans", [5]),
    ("paraphrase", "body art", [6]),
    ("paraphrase", "beach hobby", [7]),
    ("paraphrase", "who does she date", [9]),
    ("paraphrase", "injury in the kitchen", [15]),
    ("paraphrase", "coffee habit", [21]),
    ("paraphrase", "scooter", [22]),
])

USERS["wanglei"] = ("zh", [
    "在深圳一家芯片公司做硬件工程师",                                       # 0
    "每天早上喝豆浆",                                                       # 1
    "老家在湖南长沙",                                                       # 2
    "对花生过敏",                                                           # 3
    "喜欢打羽毛球",                                                         # 4
    "女儿今年上小学一年级",                                                 # 5
    "正在学习日语",                                                         # 6
    "开一辆比亚迪电动车",                                                   # 7
    "周末常去爬山",                                                         # 8
    "不喜欢吃辣",                                                           # 9
    "妻子是中学数学老师",                                                   # 10
    "用 Python 写测试脚本",                                                 # 11
    "计划明年买房",                                                         # 12
    "有轻微的近视",                                                         # 13
    "喜欢看科幻小说",                                                       # 14
    "养了一只橘猫叫大黄",                                                   # 15
    "每周健身三次",                                                         # 16
    "父母住在老家",                                                         # 17
    "希望回答简洁明了",                                                     # 18
    "经常加班到晚上十点",                                                   # 19
    "喜欢喝普洱茶",                                                         # 20
    "大学读的是电子工程专业",                                               # 21
    "春节要回长沙过年",                                                     # 22
    "在学习弹吉他",                                                         # 23
    "睡眠不好经常失眠",                                                     # 24
    "喜欢听周杰伦的歌",                                                     # 25
    "明年想去新疆旅行",                                                     # 26
    "用 Mac 电脑办公",                                                      # 27
    "正在准备英语考试",                                                     # 28
    "最近在减肥",                                                           # 29
], [
    ("lexical", "硬件工程师", [0]),
    ("lexical", "豆浆", [1]),
    ("lexical", "羽毛球", [4]),
    ("lexical", "学习日语", [6]),
    ("lexical", "比亚迪", [7]),
    ("lexical", "橘猫", [15]),
    ("lexical", "普洱茶", [20]),
    ("lexical", "吉他", [23]),
    ("lexical", "周杰伦", [25]),
    ("lexical", "新疆旅行", [26]),
    ("paraphrase", "他做什么工作", [0]),
    ("paraphrase", "他是哪里人", [2]),
    ("paraphrase", "有什么食物不能碰", [3]),
    ("paraphrase", "孩子多大了", [5]),
    ("paraphrase", "开什么车", [7]),
    ("paraphrase", "太太的职业", [10]),
    ("paraphrase", "宠物", [15]),
    ("paraphrase", "运动习惯", [16]),
    ("paraphrase", "晚上睡不着", [24]),
    ("paraphrase", "体重", [29]),
])

USERS["lina"] = ("zh", [
    "是上海一家医院的儿科医生",                                             # 0
    "每天坐地铁上班",                                                       # 1
    "喜欢做瑜伽",                                                           # 2
    "乳糖不耐受",                                                           # 3
    "丈夫是建筑师",                                                         # 4
    "儿子在读幼儿园",                                                       # 5
    "周末喜欢烤蛋糕",                                                       # 6
    "正在读公共卫生硕士",                                                   # 7
    "害怕坐飞机",                                                           # 8
    "喜欢看韩剧",                                                           # 9
    "养了两盆兰花",                                                         # 10
    "每天晚上跑步五公里",                                                   # 11
    "讨厌下雨天",                                                           # 12
    "希望医学资料用通俗的语言解释",                                         # 13
    "老家在山东青岛",                                                       # 14
    "会说英语和一点法语",                                                   # 15
    "喜欢喝拿铁咖啡",                                                       # 16
    "最近在学游泳",                                                         # 17
    "每年体检一次",                                                         # 18
    "喜欢收集明信片",                                                       # 19
    "对猫毛过敏",                                                           # 20
    "母亲和他们住在一起",                                                   # 21
    "喜欢听古典音乐",                                                       # 22
    "用华为手机",                                                           # 23
    "计划国庆节去云南",                                                     # 24
    "经常值夜班",                                                           # 25
    "不吃香菜",                                                             # 26
    "正在学书法",                                                           # 27
    "最好的朋友住在杭州",                                                   # 28
    "腰椎有点问题",                                                         # 29
], [
    ("lexical", "儿科医生", [0]),
    ("lexical", "坐地铁", [1]),
    ("lexical", "瑜伽", [2]),
    ("lexical", "乳糖", [3]),
    ("lexical", "烤蛋糕", [6]),
    ("lexical", "韩剧", [9]),
    ("lexical", "兰花", [10]),
    ("lexical", "明信片", [19]),
    ("lexical", "香菜", [26]),
    ("lexical", "书法", [27]),
    ("paraphrase", "她的职业", [0]),
    ("paraphrase", "通勤方式", [1]),
    ("paraphrase", "牛奶喝了不舒服", [3]),
    ("paraphrase", "她先生做什么", [4]),
    ("paraphrase", "孩子", [5]),
    ("paraphrase", "恐高航班", [8]),
    ("paraphrase", "她是哪里人", [14]),
    ("paraphrase", "宠物毛发", [20]),
    ("paraphrase", "假期出游", [24]),
    ("paraphrase", "背疼", [29]),
])

USERS["chenjing"] = ("zh", [
    "在杭州做电商运营",                                                     # 0
    "每天喝一杯绿茶",                                                       # 1
    "养了一只柯基犬",                                                       # 2
    "喜欢打网球",                                                           # 3
    "素食主义者",                                                           # 4
    "正在学习数据分析",                                                     # 5
    "男朋友是摄影师",                                                       # 6
    "租住在西湖附近",                                                       # 7
    "喜欢逛二手市场",                                                       # 8
    "有偏头痛",                                                             # 9
    "爱看悬疑小说",                                                         # 10
    "计划三十岁前创业",                                                     # 11
    "讨厌长时间开会",                                                       # 12
    "每周去一次游泳馆",                                                     # 13
    "用 Excel 做报表",                                                      # 14
    "妹妹在北京读大学",                                                     # 15
    "喜欢做手工皮具",                                                       # 16
    "晚上十一点前睡觉",                                                     # 17
    "不喝酒",                                                               # 18
    "喜欢吃火锅",                                                           # 19
    "想学开车",                                                             # 20
    "毕业于浙江大学",                                                       # 21
    "会弹钢琴",                                                             # 22
    "希望回答带具体例子",                                                   # 23
    "去年去了冰岛看极光",                                                   # 24
    "每天写日记",                                                           # 25
    "对芒果过敏",                                                           # 26
    "在攒钱买房",                                                           # 27
    "喜欢种多肉植物",                                                       # 28
    "父亲是退休警察",                                                       # 29
], [
    ("lexical", "电商运营", [0]),
    ("lexical", "绿茶", [1]),
    ("lexical", "柯基", [2]),
    ("lexical", "网球", [3]),
    ("lexical", "数据分析", [5]),
    ("lexical", "二手市场", [8]),
    ("lexical", "悬疑小说", [10]),
    ("lexical", "手工皮具", [16]),
    ("lexical", "冰岛极光", [24]),
    ("lexical", "多肉植物", [28]),
    ("paraphrase", "她的工作是什么", [0]),
    ("paraphrase", "宠物狗", [2]),
    ("paraphrase", "吃不吃肉", [4]),
    ("paraphrase", "男友的职业", [6]),
    ("paraphrase", "她家在什么地方", [7]),
    ("paraphrase", "头疼", [9]),
    ("paraphrase", "她的母校", [21]),
    ("paraphrase", "乐器", [22]),
    ("paraphrase", "哪种水果不能吃", [26]),
    ("paraphrase", "爸爸以前的工作", [29]),
])


# Users whose memories mix both languages (facts 0-11 English, 12-23 Chinese). Their
# `crosslingual` queries ask in one language for a fact written in the other (half Chinese to
# English, half English to Chinese); their paraphrase queries stay in one language.
USERS["zhaomin"] = ("mixed", [
    "Plays basketball every Sunday",                                        # 0
    "Works as a data engineer at a bank in Shenzhen",                       # 1
    "Allergic to shellfish",                                                # 2
    "Drives an electric car",                                               # 3
    "Is learning Japanese on weekday evenings",                             # 4
    "Prefers answers in bullet points",                                     # 5
    "His daughter just started kindergarten",                               # 6
    "Uses PostgreSQL for most projects",                                    # 7
    "Wakes up at six every day",                                            # 8
    "Is afraid of dogs",                                                    # 9
    "Wants to move to Canada next year",                                    # 10
    "Reads history books on the train",                                     # 11
    "会弹古典吉他",                                                         # 12
    "每天喝两杯咖啡",                                                       # 13
    "老家在湖南长沙",                                                       # 14
    "不吃辣",                                                               # 15
    "妻子是小学老师",                                                       # 16
    "养了两只猫",                                                           # 17
    "喜欢看科幻电影",                                                       # 18
    "晚上经常失眠",                                                         # 19
    "下个月要去新加坡出差",                                                 # 20
    "用 Vim 写代码",                                                        # 21
    "喜欢收集邮票",                                                         # 22
    "在学习做面包",                                                         # 23
], [
    ("crosslingual", "他周末做什么运动", [0]),
    ("crosslingual", "他在哪里上班", [1]),
    ("crosslingual", "他对什么过敏", [2]),
    ("crosslingual", "他开什么车", [3]),
    ("crosslingual", "他在学什么外语", [4]),
    ("crosslingual", "他孩子在上学吗", [6]),
    ("crosslingual", "他怕什么动物", [9]),
    ("crosslingual", "他打算搬到哪个国家", [10]),
    ("crosslingual", "What instrument can he play?", [12]),
    ("crosslingual", "how much coffee does he drink", [13]),
    ("crosslingual", "where is he from originally", [14]),
    ("crosslingual", "can he eat spicy food", [15]),
    ("crosslingual", "what does his wife do", [16]),
    ("crosslingual", "does he have pets", [17]),
    ("crosslingual", "does he sleep well", [19]),
    ("crosslingual", "any upcoming business trips", [20]),
    ("paraphrase", "which database does he rely on", [7]),
    ("paraphrase", "preferred reply format", [5]),
    ("paraphrase", "他收藏什么", [22]),
    ("paraphrase", "他睡眠怎么样", [19]),
])

USERS["liwei"] = ("mixed", [
    "Works as a UX designer at a game studio",                              # 0
    "Is vegetarian",                                                        # 1
    "Takes the subway to work",                                             # 2
    "Her cat is called Mochi",                                              # 3
    "Plays tennis on Saturday mornings",                                    # 4
    "Is saving for a trip to Iceland",                                      # 5
    "Prefers short answers",                                                # 6
    "Her brother is a doctor in Beijing",                                   # 7
    "Draws comics in her spare time",                                       # 8
    "Can't stand horror movies",                                            # 9
    "Uses Figma every day",                                                 # 10
    "Was born in 1994",                                                     # 11
    "住在上海静安区",                                                       # 12
    "喜欢喝奶茶",                                                           # 13
    "大学学的是建筑",                                                       # 14
    "每周上两次瑜伽课",                                                     # 15
    "近视八百度",                                                           # 16
    "男朋友是厨师",                                                         # 17
    "正在学法语",                                                           # 18
    "怕坐飞机",                                                             # 19
    "喜欢种花",                                                             # 20
    "每天晚上写日记",                                                       # 21
    "对海鲜过敏",                                                           # 22
    "最喜欢的歌手是周杰伦",                                                 # 23
], [
    ("crosslingual", "她做什么工作", [0]),
    ("crosslingual", "她吃肉吗", [1]),
    ("crosslingual", "她怎么去上班", [2]),
    ("crosslingual", "她的宠物叫什么", [3]),
    ("crosslingual", "她周六上午打什么球", [4]),
    ("crosslingual", "她在为哪次旅行存钱", [5]),
    ("crosslingual", "她哥哥是做什么的", [7]),
    ("crosslingual", "她哪一年出生", [11]),
    ("crosslingual", "which part of the city does she live in", [12]),
    ("crosslingual", "what drink does she like", [13]),
    ("crosslingual", "what did she study at university", [14]),
    ("crosslingual", "how is her eyesight", [16]),
    ("crosslingual", "what does her boyfriend do for a living", [17]),
    ("crosslingual", "which foreign language is she learning", [18]),
    ("crosslingual", "is she afraid of flying", [19]),
    ("crosslingual", "who is her favourite singer", [23]),
    ("paraphrase", "what software does she design with", [10]),
    ("paraphrase", "films she dislikes", [9]),
    ("paraphrase", "她有什么睡前习惯", [21]),
    ("paraphrase", "她的偶像", [23]),
])

USERS["david"] = ("mixed", [
    "Teaches English at a university in Chengdu",                           # 0
    "Is from Manchester",                                                   # 1
    "Supports Manchester United",                                           # 2
    "Has a dog named Biscuit",                                              # 3
    "Is lactose intolerant",                                                # 4
    "Rides a motorbike to campus",                                          # 5
    "Married to a woman he met in Sichuan",                                 # 6
    "Plays the drums in a band",                                            # 7
    "Prefers examples in Python",                                           # 8
    "Is writing a novel",                                                   # 9
    "Goes hiking in the mountains once a month",                            # 10
    "Has lived in China for eight years",                                   # 11
    "喜欢吃火锅",                                                           # 12
    "中文水平是HSK五级",                                                    # 13
    "每天早上练太极",                                                       # 14
    "想在成都买房",                                                         # 15
    "儿子今年三岁",                                                         # 16
    "不喝酒",                                                               # 17
    "周末去茶馆打麻将",                                                     # 18
    "在学做川菜",                                                           # 19
    "有高血压",                                                             # 20
    "最喜欢的城市是重庆",                                                   # 21
    "手机用的是华为",                                                       # 22
    "喜欢听京剧",                                                           # 23
], [
    ("crosslingual", "他的职业是什么", [0]),
    ("crosslingual", "他是哪里人", [1]),
    ("crosslingual", "他支持哪支球队", [2]),
    ("crosslingual", "他的狗叫什么名字", [3]),
    ("crosslingual", "他能喝牛奶吗", [4]),
    ("crosslingual", "他怎么去学校", [5]),
    ("crosslingual", "他会什么乐器", [7]),
    ("crosslingual", "他在中国住了多久", [11]),
    ("crosslingual", "what is his favourite food", [12]),
    ("crosslingual", "how good is his Chinese", [13]),
    ("crosslingual", "what exercise does he do in the morning", [14]),
    ("crosslingual", "does he have children", [16]),
    ("crosslingual", "does he drink alcohol", [17]),
    ("crosslingual", "what game does he play at the weekend", [18]),
    ("crosslingual", "what is his blood pressure like", [20]),
    ("crosslingual", "which phone does he use", [22]),
    ("paraphrase", "his fiction project", [9]),
    ("paraphrase", "outdoor activity every few weeks", [10]),
    ("paraphrase", "他打算置业的地方", [15]),
    ("paraphrase", "他爱听的戏", [23]),
])

USERS["sunyu"] = ("mixed", [
    "Is doing a PhD in chemistry in Munich",                                # 0
    "Her supervisor is Professor Weber",                                    # 1
    "Cycles to the lab",                                                    # 2
    "Is allergic to penicillin",                                            # 3
    "Likes answers with references",                                        # 4
    "Plays badminton on Wednesday nights",                                  # 5
    "Shares a flat with two roommates",                                     # 6
    "Her thesis is due next summer",                                        # 7
    "Uses LaTeX for all her papers",                                        # 8
    "Learned to ski last winter",                                           # 9
    "Is a fan of Taylor Swift",                                             # 10
    "Wants to work in industry after graduating",                           # 11
    "老家在四川成都",                                                       # 12
    "男朋友在国内工作",                                                     # 13
    "每天和妈妈视频",                                                       # 14
    "喜欢做红烧肉",                                                         # 15
    "养了一只仓鼠",                                                         # 16
    "会说一点德语",                                                         # 17
    "晚上经常熬夜",                                                         # 18
    "喜欢看宫崎骏的动画",                                                   # 19
    "有低血糖",                                                             # 20
    "周末去教会唱诗班",                                                     # 21
    "爸爸是中学数学老师",                                                   # 22
    "想买一台相机",                                                         # 23
], [
    ("crosslingual", "她在读什么学位", [0]),
    ("crosslingual", "她的导师是谁", [1]),
    ("crosslingual", "她怎么去实验室", [2]),
    ("crosslingual", "她对哪种药过敏", [3]),
    ("crosslingual", "她每周三晚上做什么运动", [5]),
    ("crosslingual", "她和谁合租", [6]),
    ("crosslingual", "她的毕业论文什么时候交", [7]),
    ("crosslingual", "她毕业后想做什么", [11]),
    ("crosslingual", "where does her family come from", [12]),
    ("crosslingual", "where is her boyfriend", [13]),
    ("crosslingual", "how often does she talk to her mother", [14]),
    ("crosslingual", "what dish does she like to cook", [15]),
    ("crosslingual", "does she keep a pet", [16]),
    ("crosslingual", "does she speak German", [17]),
    ("crosslingual", "what films does she enjoy", [19]),
    ("crosslingual", "what does her father do", [22]),
    ("paraphrase", "document typesetting tool", [8]),
    ("paraphrase", "snow sport she picked up recently", [9]),
    ("paraphrase", "她睡得晚吗", [18]),
    ("paraphrase", "她想添置的电子产品", [23]),
])


def en_words(text):
    return {w for w in re.findall(r"[a-z0-9]+", text.lower())}


def zh_bigrams(text):
    han = re.findall(r"[\u4e00-\u9fff]+", text)
    grams = set()
    for run in han:
        if len(run) == 1:
            grams.add(run)
        grams.update(run[i:i + 2] for i in range(len(run) - 1))
    return grams | en_words(text)


def text_lang(text):
    """A text's language in a mixed memory: Chinese when it has a Han character."""
    return "zh" if re.search(r"[\u4e00-\u9fff]", text) else "en"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    lines, problems, n_facts, n_queries = [], [], 0, 0
    for user, (lang, facts, queries) in USERS.items():
        def lang_of(text):
            return text_lang(text) if lang == "mixed" else lang
        for i, content in enumerate(facts):
            lines.append({"type": "fact", "user": user, "id": f"{user}-{i:02d}",
                          "content": content, "lang": lang_of(content)})
            n_facts += 1
        for j, (kind, text, relevant) in enumerate(queries):
            q_lang = lang_of(text)
            tokens = en_words if q_lang == "en" else zh_bigrams
            shared = set()
            for r in relevant:
                shared |= tokens(text) & tokens(facts[r])
                if kind == "crosslingual" and lang_of(facts[r]) == q_lang:
                    problems.append(f"{user} query {text!r}: crosslingual, fact {r} is in its language")
                if kind != "crosslingual" and lang_of(facts[r]) != q_lang:
                    problems.append(f"{user} query {text!r}: {kind}, fact {r} is in another language")
            if kind in ("paraphrase", "crosslingual") and shared:
                problems.append(f"{user} query {text!r}: {kind} shares {sorted(shared)}")
            if kind == "lexical" and not shared:
                problems.append(f"{user} query {text!r}: lexical shares nothing")
            lines.append({"type": "query", "user": user, "id": f"{user}-q{j:02d}",
                          "query": text, "kind": kind, "lang": q_lang,
                          "relevant": [f"{user}-{r:02d}" for r in relevant]})
            n_queries += 1
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    with open(os.path.join(here, "dev.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"{len(USERS)} users, {n_facts} facts, {n_queries} queries")


if __name__ == "__main__":
    main()
